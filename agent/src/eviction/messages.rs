//! What an eviction says (`evictionMessage` and the constants of `helpers.go`), and the
//! admission check under node pressure (`managerImpl.Admit`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::lifecycle::admission::Rejection;
use crate::types::pod::is_critical_pod;
use crate::types::qos::{QosClass, qos_class};

use super::observations::{Observations, PodUsage};
use super::thresholds::{NodeCondition, Resource, Threshold};
use crate::types::quantity::Quantity;

/// The reason of an evicted pod's status, its event and an admission refusal.
pub const REASON: &str = "Evicted";
/// Annotation key of an eviction event: the containers above their request.
pub const OFFENDING_CONTAINERS_KEY: &str = "offending_containers";
/// Annotation key: those containers' usage.
pub const OFFENDING_CONTAINERS_USAGE_KEY: &str = "offending_containers_usage";
/// Annotation key: the pod above its pod-level request.
pub const OFFENDING_POD_KEY: &str = "offending_pod";
/// Annotation key: that pod's usage.
pub const OFFENDING_POD_USAGE_KEY: &str = "offending_pod_usage";
/// Annotation key: the starved resource.
pub const STARVED_RESOURCE_KEY: &str = "starved_resource";
/// The pod condition an eviction adds (`v1.DisruptionTarget`).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason (`v1.PodReasonTerminationByKubelet`).
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";
/// The taint a `BestEffort` pod must tolerate to be admitted under memory pressure.
pub const TAINT_NODE_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";

/// `evictionMessage`: the message and the event annotations of evicting `pod` to reclaim
/// `resource`. `thresholds` are the thresholds acted on in this pass; the first one of the
/// resource with an observation gives the "Threshold quantity" part.
#[must_use]
pub fn eviction_message(
    resource: Resource,
    pod: &Pod,
    usage: Option<&PodUsage>,
    thresholds: &[Threshold],
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut annotations = BTreeMap::new();
    let mut message = format!("The node was low on resource: {resource}. ");
    let met = thresholds
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| observations.get(&t.signal).map(|o| (t.value.quantity(o.capacity), o.available)));
    if let Some((quantity, available)) = met {
        let _ = write!(message, "Threshold quantity: {quantity}, available: {available}. ");
    }
    let Some(usage) = usage else { return (message, annotations) };
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let spec = pod.spec.as_ref();
    if resource == Resource::Memory
        && crate::types::pod_resources::is_pod_level_resources_set(pod)
        && let Some(request) = spec
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource.as_str()))
        && let Some(ws) = usage.memory_working_set_bytes
    {
        let used = Quantity::bytes(ws);
        let request = Quantity::parse(&request.0).unwrap_or(Quantity::ZERO);
        let _ = write!(
            message,
            "Pod {name} was using {used}, request is {request}, has larger consumption of {resource}. "
        );
        annotations.insert(OFFENDING_POD_KEY.to_owned(), name.to_owned());
        annotations.insert(OFFENDING_POD_USAGE_KEY.to_owned(), used.to_string());
    }
    // Ephemeral containers cannot have requests and are never blamed.
    let containers: Vec<&Container> =
        spec.map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()).collect()).unwrap_or_default();
    let (mut exceeded, mut exceeded_usage) = (Vec::new(), Vec::new());
    for stats in &usage.containers {
        let Some(container) = containers.iter().find(|c| c.name == stats.name) else { continue };
        let request = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource.as_str()))
            .and_then(|q| Quantity::parse(&q.0).ok())
            .unwrap_or(Quantity::ZERO);
        let used = match resource {
            Resource::EphemeralStorage => stats
                .rootfs
                .and_then(|r| r.used_bytes)
                .zip(stats.logs.and_then(|l| l.used_bytes))
                .map(|(r, l)| Quantity::bytes(r.saturating_add(l))),
            Resource::Memory => stats.memory_working_set_bytes.map(Quantity::bytes),
            Resource::Inodes | Resource::Pids => None,
        };
        if let Some(used) = used
            && used > request
        {
            let _ = write!(
                message,
                "Container {} was using {used}, request is {request}, has larger consumption of {resource}. ",
                container.name
            );
            exceeded.push(container.name.clone());
            exceeded_usage.push(used.to_string());
        }
    }
    annotations.insert(OFFENDING_CONTAINERS_KEY.to_owned(), exceeded.join(","));
    annotations.insert(OFFENDING_CONTAINERS_USAGE_KEY.to_owned(), exceeded_usage.join(","));
    annotations.insert(STARVED_RESOURCE_KEY.to_owned(), resource.as_str().to_owned());
    (message, annotations)
}

/// The `DisruptionTarget` condition of an evicted pod.
#[must_use]
pub fn disruption_target_condition(message: &str) -> PodCondition {
    PodCondition {
        type_: DISRUPTION_TARGET.to_owned(),
        status: "True".to_owned(),
        reason: Some(TERMINATION_BY_KUBELET.to_owned()),
        message: Some(message.to_owned()),
        ..PodCondition::default()
    }
}

/// What the pod worker writes into an evicted pod's status (upstream's status function
/// of `killPodNow`): phase `Failed`, reason `Evicted`, the message, and `condition`
/// upserted (its `lastTransitionTime` set to `now` when its status changes).
pub fn apply_eviction_status(status: &mut PodStatus, message: &str, condition: Option<&PodCondition>, now: Time) {
    status.phase = Some("Failed".to_owned());
    status.reason = Some(REASON.to_owned());
    status.message = Some(message.to_owned());
    let Some(condition) = condition else { return };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            let transition =
                if existing.status == condition.status { existing.last_transition_time.clone() } else { None };
            *existing =
                PodCondition { last_transition_time: transition.or_else(|| Some(now.clone())), ..condition.clone() };
        }
        None => conditions.push(PodCondition { last_transition_time: Some(now), ..condition.clone() }),
    }
}

/// `TolerationsTolerateTaint` for the `NoSchedule` memory-pressure taint.
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    tolerations.iter().any(|t| {
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoSchedule");
        let key_ok = t.key.as_deref().is_none_or(|k| k.is_empty() || k == TAINT_NODE_MEMORY_PRESSURE);
        let value_ok = match t.operator.as_deref().unwrap_or_default() {
            "" | "Equal" => t.value.as_deref().unwrap_or_default().is_empty(),
            "Exists" => true,
            _ => false,
        };
        effect_ok && key_ok && value_ok
    })
}

/// `nodeConditionMessageFmt` with Go's `%v` of the condition list.
#[must_use]
pub fn node_condition_message(conditions: &[NodeCondition]) -> String {
    let list: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    format!("The node had condition: [{}]. ", list.join(" "))
}

/// `Admit`: under pressure, critical pods are admitted; under memory pressure alone,
/// pods that are not `BestEffort`, and `BestEffort` pods tolerating the memory-pressure
/// taint; anything else is refused with reason `Evicted`.
///
/// # Errors
/// The refusal, with the kubelet's reason and message.
pub fn admit(conditions: &[NodeCondition], pod: &Pod) -> Result<(), Rejection> {
    if conditions.is_empty() || is_critical_pod(pod) {
        return Ok(());
    }
    if conditions == [NodeCondition::MemoryPressure]
        && (qos_class(pod) != QosClass::BestEffort || tolerates_memory_pressure(pod))
    {
        return Ok(());
    }
    tracing::info!(pod = ?pod.metadata.name, ?conditions, "failed to admit pod to node");
    Err(Rejection { reason: REASON.to_owned(), message: node_condition_message(conditions) })
}
