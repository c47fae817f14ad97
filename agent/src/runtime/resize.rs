//! Actuating in-place resizes (upstream `computePodResizeAction` / `doPodResizeAction` in
//! `kuberuntime_manager.go`).
//!
//! [`compute_pod_resize_action`] compares each running resizable container's allocated
//! resources (the pod given to `SyncPod` carries them) with what it was last given (see
//! [`crate::allocation`]): a changed resource whose `resizePolicy` says `RestartContainer`
//! restarts the container (killed with "Container <name> resize requires restart" and
//! started again with the new resources); otherwise the container is updated in place.
//! A container whose actuated resources are unknown (after an agent restart) is updated in
//! place with its allocation, never restarted. A container without its own cpu or memory
//! limit is compared with the pod-level limit it inherits, so a pod-level resize
//! (`InPlacePodLevelResourcesVerticalScaling`) updates it as its own resize would; the
//! pod-level resources themselves are compared with what the pod cgroup was last given.
//!
//! [`do_pod_resize_action`] then applies, per resource (memory, then cpu), in upstream's
//! order: limits grow on the pod cgroup before the containers and shrink after them;
//! requests (cpu shares) likewise. A pod memory limit set or lowered below the pod's
//! current usage is refused with upstream's message. Containers get `UpdateContainerResources` with the
//! resized resource's new values and the other resource's current ones; a change of only
//! the memory request needs no runtime call (it only counts for scheduling).

use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::manager::PodActions;
use crate::allocation::{AllocationManager, ResourceValues, values_match};
use crate::cm::PodContainerManager;
use crate::cm::resources::PodResourceConfig;
use crate::container::RuntimeService;
use crate::container::pod_status::{ContainerState, RuntimePodStatus};

/// One container to update in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerUpdate {
    /// Index into `spec.containers` (or `spec.initContainers` when `init`).
    pub index: usize,
    pub init: bool,
    pub id: String,
    pub name: String,
    pub current: ResourceValues,
    pub desired: ResourceValues,
}

/// What a resize needs beyond the pod actions' restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResizePlan {
    /// The pod cgroup's limits follow the allocation.
    pub update_pod_resources: bool,
    /// Containers whose memory limit changes.
    pub memory: Vec<ContainerUpdate>,
    /// Containers whose cpu request or limit changes.
    pub cpu: Vec<ContainerUpdate>,
    /// Containers where only the memory request changes: (name, new values).
    pub memory_request_only: Vec<(String, ResourceValues)>,
    /// The pod-level resources to give the pod cgroup (`UpdatePodLevelResources`).
    pub pod_level: Option<ResourceValues>,
}

impl ResizePlan {
    fn is_empty(&self) -> bool {
        !self.update_pod_resources
            && self.memory.is_empty()
            && self.cpu.is_empty()
            && self.memory_request_only.is_empty()
    }
}

fn policy_restarts(c: &Container, resource: &str) -> bool {
    c.resize_policy.iter().flatten().any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
}

/// Upstream `computePodResizeAction` for every resizable running container, and
/// `computePodLevelResourcesResizeAction`; restarts go into `actions`.
/// `actuated(container)` is what the container was last given (`None`: unknown), with
/// the pod-level limits it inherits; `pod_actuated` what the pod cgroup was last given at
/// pod level. `None` when nothing is to be resized.
pub fn compute_pod_resize_action(
    pod: &Pod,
    status: &RuntimePodStatus,
    actuated: &dyn Fn(&str) -> Option<ResourceValues>,
    pod_actuated: Option<ResourceValues>,
    actions: &mut PodActions,
) -> Option<ResizePlan> {
    if actions.kill_pod || actions.create_sandbox {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let mut plan = ResizePlan::default();
    // Init containers too: sidecars, and a plain init container while it runs (the pod
    // is initializing; upstream `computeInitContainerActions` resizes the running one).
    let inits = spec.init_containers.iter().flatten().enumerate().map(|(i, c)| (i, c, true));
    let apps = spec.containers.iter().enumerate().map(|(i, c)| (i, c, false));
    for (index, c, init) in inits.chain(apps) {
        let Some(s) = status.find_container(&c.name).filter(|s| s.state == ContainerState::Running) else { continue };
        if actions.containers_to_kill.contains_key(&s.id) {
            continue;
        }
        let desired = ResourceValues::of_container(pod, c);
        let Some(current) = actuated(&c.name) else {
            // Unknown (agent restart): apply the allocation in place, once.
            let update =
                ContainerUpdate { index, init, id: s.id.clone(), name: c.name.clone(), current: desired, desired };
            plan.memory.push(update.clone());
            plan.cpu.push(update);
            plan.update_pod_resources = true;
            continue;
        };
        if values_match(desired, current) {
            continue;
        }
        let mem_lim = desired.memory_limit != current.memory_limit;
        let mem_req = desired.memory_request != current.memory_request;
        let cpu = desired.cpu_limit != current.cpu_limit || desired.cpu_request != current.cpu_request;
        let restart = ((mem_lim || mem_req) && policy_restarts(c, "memory")) || (cpu && policy_restarts(c, "cpu"));
        plan.update_pod_resources = true;
        if restart {
            actions
                .containers_to_kill
                .insert(s.id.clone(), (c.name.clone(), format!("Container {} resize requires restart", c.name)));
            let to_start = if init { &mut actions.init_containers_to_start } else { &mut actions.containers_to_start };
            if !to_start.contains(&index) {
                to_start.push(index);
                to_start.sort_unstable();
            }
            continue;
        }
        let update = ContainerUpdate { index, init, id: s.id.clone(), name: c.name.clone(), current, desired };
        if mem_lim {
            plan.memory.push(update.clone());
        } else if mem_req {
            plan.memory_request_only
                .push((c.name.clone(), ResourceValues { memory_request: desired.memory_request, ..current }));
        }
        if cpu {
            plan.cpu.push(update);
        }
    }
    // Pod-level resources changed, added (a resize may add them) or not.
    let desired = ResourceValues::of_pod(pod);
    if let Some(current) = pod_actuated
        && !values_match(desired, current)
    {
        plan.pod_level = Some(desired);
        plan.update_pod_resources = true;
    }
    (!plan.is_empty()).then_some(plan)
}

/// What the runtime reports a running container has (CRI `ContainerStatus.resources`),
/// with the memory request of its allocation (which no runtime knows): the actuated
/// resources when the agent has no record of them (after a restart). `None` when the
/// runtime reports nothing.
#[must_use]
pub fn reported_values(pod: &Pod, status: &RuntimePodStatus, name: &str) -> Option<ResourceValues> {
    let running = status.find_container(name).filter(|c| c.state == ContainerState::Running)?;
    let (cpu_request, cpu_limit, memory_limit) =
        crate::allocation::cri_values(status.container_resources.get(&running.id)?);
    let spec = pod.spec.as_ref()?;
    let allocated = spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)?;
    Some(ResourceValues {
        cpu_request: cpu_request.unwrap_or(0),
        cpu_limit: cpu_limit.unwrap_or(0),
        memory_limit: memory_limit.unwrap_or(0),
        memory_request: ResourceValues::of_container(pod, allocated).memory_request,
    })
}

/// The container to send to the runtime when resizing `resource` (upstream
/// `updatePodContainerResources`): the resized resource's new values, the other's current
/// ones (which a memory update just before a cpu update has already moved).
fn container_for_update(
    spec: &Container,
    current: ResourceValues,
    desired: ResourceValues,
    memory: bool,
) -> (Container, ResourceValues) {
    let values = if memory {
        ResourceValues { memory_limit: desired.memory_limit, memory_request: desired.memory_request, ..current }
    } else {
        ResourceValues { cpu_limit: desired.cpu_limit, cpu_request: desired.cpu_request, ..current }
    };
    let mut c = spec.clone();
    c.resources = Some(values.to_requirements());
    (c, values)
}

fn spec_container<'a>(pod: &'a Pod, u: &ContainerUpdate) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    if u.init { spec.init_containers.as_ref()?.get(u.index) } else { spec.containers.get(u.index) }
}

async fn update_containers(
    rt: &dyn RuntimeService,
    alloc: &AllocationManager,
    pod: &Pod,
    updates: &[ContainerUpdate],
    memory: bool,
) -> Result<(), String> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    for u in updates {
        let Some(spec) = spec_container(pod, u) else { continue };
        let current = alloc.actuated(uid, &u.name).unwrap_or(u.current);
        let (container, values) = container_for_update(spec, current, u.desired, memory);
        let linux = crate::cm::linux_container_resources(pod, &container);
        rt.update_container_resources(&u.id, linux)
            .await
            .map_err(|e| format!("failed to update resources of container {}: {e}", u.name))?;
        alloc.set_actuated(uid, &u.name, values);
    }
    Ok(())
}

/// The part of `cfg` that concerns `memory` (else cpu).
fn part(cfg: &PodResourceConfig, memory: bool, limit: bool) -> PodResourceConfig {
    match (memory, limit) {
        (true, _) => PodResourceConfig { memory_limit: cfg.memory_limit, ..PodResourceConfig::default() },
        (false, true) => {
            PodResourceConfig { cpu_quota: cfg.cpu_quota, cpu_period: cfg.cpu_period, ..PodResourceConfig::default() }
        }
        (false, false) => PodResourceConfig { cpu_shares: cfg.cpu_shares, ..PodResourceConfig::default() },
    }
}

/// An unset or unlimited value compares as the largest.
fn limit_value(v: Option<i64>) -> i64 {
    match v {
        Some(v) if v > 0 => v,
        _ => i64::MAX,
    }
}

/// Upstream `doPodResizeAction`: applies `plan` to the pod cgroup and the containers.
///
/// # Errors
/// The message of the first failure (it becomes the `PodResizeInProgress` error).
pub async fn do_pod_resize_action(
    rt: &dyn RuntimeService,
    cm: &dyn PodContainerManager,
    alloc: &AllocationManager,
    pod: &Pod,
    plan: &ResizePlan,
) -> Result<(), String> {
    let start = Instant::now();
    let outcome = async {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        for (c, values) in &plan.memory_request_only {
            alloc.set_actuated(uid, c, *values);
        }
        let desired = crate::cm::resources::resource_config_for_pod(pod, true);
        let current = if plan.update_pod_resources {
            cm.pod_cgroup_config(pod).map_err(|e| format!("failed to read the pod cgroup of pod {name}: {e}"))?
        } else {
            None
        };
        let set_pod = |cfg: PodResourceConfig| -> Result<(), String> {
            cm.update_pod_cgroup(pod, &cfg).map_err(|e| format!("failed to set the pod cgroup of pod {name}: {e}"))
        };

        // Memory: the limit is the only pod-level memory setting.
        if !plan.memory.is_empty() || plan.update_pod_resources {
            let (cur, new) = match &current {
                Some(c) => (limit_value(c.memory_limit), limit_value(desired.memory_limit)),
                None => (0, 0),
            };
            // Upstream `validateMemoryResizeAction`: a pod limit set or lowered must stay
            // above the pod's usage.
            if current.is_some()
                && new != i64::MAX
                && new < cur
                && let Ok(Some(usage)) = cm.pod_memory_usage(pod)
                && i64::try_from(usage).unwrap_or(i64::MAX) >= new
            {
                return Err(format!(
                    "cannot decrease memory limits: attempting to set pod memory limit ({new}) below current usage ({usage})"
                ));
            }
            if current.is_some() && new > cur {
                set_pod(part(&desired, true, true))?;
            }
            update_containers(rt, alloc, pod, &plan.memory, true).await?;
            if current.is_some() && new < cur {
                set_pod(part(&desired, true, true))?;
            }
        }
        // Cpu: quota (limit) and shares (request).
        if !plan.cpu.is_empty() || plan.update_pod_resources {
            let (cur_lim, new_lim, cur_req, new_req) = match &current {
                Some(c) => (
                    limit_value(c.cpu_quota),
                    limit_value(desired.cpu_quota),
                    c.cpu_shares.unwrap_or(0),
                    desired.cpu_shares.unwrap_or(0),
                ),
                None => (0, 0, 0, 0),
            };
            let known = current.is_some();
            if known && new_lim > cur_lim {
                set_pod(part(&desired, false, true))?;
            }
            if known && new_req > cur_req {
                set_pod(part(&desired, false, false))?;
            }
            update_containers(rt, alloc, pod, &plan.cpu, false).await?;
            if known && new_req < cur_req {
                set_pod(part(&desired, false, false))?;
            }
            if known && new_lim < cur_lim {
                set_pod(part(&desired, false, true))?;
            }
        }
        if let Some(values) = plan.pod_level {
            alloc.set_pod_actuated(uid, values);
        }
        Ok(())
    }
    .await;
    alloc.metrics().observe_duration(start.elapsed(), outcome.is_ok());
    outcome
}

#[cfg(test)]
mod tests;
