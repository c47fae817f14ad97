//! The device manager's bookkeeping, free of I/O: devices per resource and their health,
//! which container holds which devices (upstream `podDevices`), the devices an init
//! container frees for the next containers, and the choice of devices for a request
//! (upstream `devicesToAllocate`, minus the plugin calls, which the manager makes).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ResourceHealth, ResourceStatus};
use prost::Message as _;

use super::checkpoint::{CheckpointData, PodDevicesEntry};
use super::proto;
use super::{HEALTHY, PluginApi};

/// NUMA node key of devices without topology (upstream `nodeWithoutTopology`).
pub const NO_TOPOLOGY: i64 = -1;

/// One registered plugin (upstream `endpointInfo`).
#[derive(Clone)]
pub struct Endpoint {
    /// `None` for a resource restored from the checkpoint whose plugin has not
    /// registered again yet (upstream's stopped endpoint).
    pub api: Option<std::sync::Arc<dyn PluginApi>>,
    pub options: proto::DevicePluginOptions,
    /// When the plugin went away; its resource is removed a grace period later.
    pub stopped_at: Option<Instant>,
    /// Tells a replaced plugin's stream apart from its successor's.
    pub generation: u64,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("connected", &self.api.is_some())
            .field("options", &self.options)
            .field("stopped_at", &self.stopped_at)
            .finish_non_exhaustive()
    }
}

/// A container's devices of one resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerDevices {
    /// Device ids per NUMA node ([`NO_TOPOLOGY`] for none).
    pub by_numa: BTreeMap<i64, Vec<String>>,
    pub response: proto::ContainerAllocateResponse,
}

impl ContainerDevices {
    #[must_use]
    pub fn ids(&self) -> BTreeSet<String> {
        self.by_numa.values().flatten().cloned().collect()
    }
}

/// pod UID -> container name -> resource -> devices.
pub type PodDevices = BTreeMap<String, BTreeMap<String, BTreeMap<String, ContainerDevices>>>;

/// Everything the manager knows, behind one lock.
#[derive(Debug, Default)]
pub struct State {
    pub endpoints: HashMap<String, Endpoint>,
    pub all_devices: HashMap<String, BTreeMap<String, proto::Device>>,
    pub healthy: HashMap<String, BTreeSet<String>>,
    pub unhealthy: HashMap<String, BTreeSet<String>>,
    /// Resources whose plugin is gone for good: reported with capacity 0 (as upstream,
    /// so the node still tells them apart from cluster-level resources).
    pub removed: BTreeSet<String>,
    pub pod_devices: PodDevices,
    pub allocated: HashMap<String, BTreeSet<String>>,
    /// The pod being admitted: devices its init containers hold, free for the next
    /// containers (upstream `devicesToReuse`).
    pub devices_to_reuse: HashMap<String, HashMap<String, BTreeSet<String>>>,
    /// The active pods as last told by the topology manager.
    pub active: Option<HashSet<String>>,
    pub next_generation: u64,
}

/// Capacity and allocatable of the device plugin resources, as counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtendedResources {
    pub capacity: BTreeMap<String, i64>,
    pub allocatable: BTreeMap<String, i64>,
    /// No checkpoint: the node is new (or was wiped), so extended resources an existing
    /// node object still shows are zeroed at registration (upstream
    /// `ShouldResetExtendedResourceCapacity`).
    pub reset_unknown: bool,
}

impl State {
    /// Upstream `isDevicePluginResource`: registered, or still held by a container.
    #[must_use]
    pub fn is_device_plugin_resource(&self, resource: &str) -> bool {
        self.healthy.contains_key(resource) || self.allocated.contains_key(resource)
    }

    /// A plugin's new device list (upstream `genericDeviceUpdateCallback`). Returns the
    /// UIDs of the pods holding a device whose health changed or that is back in the
    /// list (upstream's `ResourceHealthStatus` update): their containers'
    /// `allocatedResourcesStatus` is to be written again.
    pub fn update_devices(&mut self, resource: &str, devices: Vec<proto::Device>) -> BTreeSet<String> {
        let old = std::mem::take(self.all_devices.entry(resource.to_owned()).or_default());
        let holder = |id: &str| {
            self.pod_devices.iter().find_map(|(pod, containers)| {
                containers.values().any(|r| r.get(resource).is_some_and(|d| d.ids().contains(id))).then(|| pod.clone())
            })
        };
        let pods: BTreeSet<String> = devices
            .iter()
            .filter(|d| old.get(&d.id).is_none_or(|o| o.health != d.health))
            .filter_map(|d| holder(&d.id))
            .collect();
        let healthy = self.healthy.entry(resource.to_owned()).or_default();
        healthy.clear();
        let unhealthy = self.unhealthy.entry(resource.to_owned()).or_default();
        unhealthy.clear();
        let all = self.all_devices.entry(resource.to_owned()).or_default();
        for d in devices {
            if d.health == HEALTHY {
                healthy.insert(d.id.clone());
            } else {
                unhealthy.insert(d.id.clone());
            }
            all.insert(d.id.clone(), d);
        }
        self.removed.remove(resource);
        pods
    }

    /// The health of the devices `container` of `pod` holds, per resource (upstream
    /// `UpdateAllocatedResourcesStatus`): `Healthy` as the plugin last reported it, or
    /// when it no longer lists the device; `Unhealthy` otherwise. A plugin that went away
    /// leaves its devices' last reported health (as upstream: only the node's allocatable
    /// counts them unhealthy).
    #[must_use]
    pub fn allocated_resources_status(&self, pod: &str, container: &str) -> Vec<ResourceStatus> {
        let Some(resources) = self.pod_devices.get(pod).and_then(|c| c.get(container)) else { return Vec::new() };
        resources
            .iter()
            .map(|(resource, devices)| {
                let known = self.all_devices.get(resource);
                let health = |id: &str| {
                    let healthy = known.and_then(|k| k.get(id)).is_none_or(|d| d.health == HEALTHY);
                    if healthy { "Healthy" } else { "Unhealthy" }
                };
                ResourceStatus {
                    name: resource.clone(),
                    resources: Some(
                        devices
                            .ids()
                            .into_iter()
                            .map(|id| ResourceHealth {
                                health: Some(health(&id).to_owned()),
                                message: None,
                                resource_id: id,
                            })
                            .collect(),
                    ),
                }
            })
            .collect()
    }

    /// The plugin went away: its devices become unhealthy (upstream
    /// `markResourceUnhealthy`) and the grace period starts.
    pub fn plugin_gone(&mut self, resource: &str, now: Instant) {
        if let Some(e) = self.endpoints.get_mut(resource) {
            e.stopped_at = Some(now);
            e.api = None;
        }
        let healthy = std::mem::take(self.healthy.entry(resource.to_owned()).or_default());
        self.unhealthy.entry(resource.to_owned()).or_default().extend(healthy);
    }

    /// Capacity (all devices) and allocatable (healthy devices) per resource; resources
    /// whose plugin has been gone longer than `grace` are removed here (upstream
    /// `GetCapacity`). The bool says whether something was removed (the checkpoint
    /// changes).
    pub fn capacity(&mut self, now: Instant, grace: Duration) -> (ExtendedResources, bool) {
        let mut out = ExtendedResources::default();
        let mut changed = false;
        let names: BTreeSet<String> = self.healthy.keys().chain(self.unhealthy.keys()).cloned().collect();
        for r in names {
            let expired = self
                .endpoints
                .get(&r)
                .is_none_or(|e| e.stopped_at.is_some_and(|t| now.saturating_duration_since(t) >= grace));
            if expired {
                tracing::info!(resource = %r, "device plugin gone for the endpoint stop grace period; removing its resource");
                self.endpoints.remove(&r);
                self.healthy.remove(&r);
                self.unhealthy.remove(&r);
                self.all_devices.remove(&r);
                self.removed.insert(r);
                changed = true;
                continue;
            }
            let h = self.healthy.get(&r).map_or(0, BTreeSet::len) as i64;
            let u = self.unhealthy.get(&r).map_or(0, BTreeSet::len) as i64;
            out.capacity.insert(r.clone(), h + u);
            out.allocatable.insert(r, h);
        }
        for r in &self.removed {
            out.capacity.insert(r.clone(), 0);
            out.allocatable.insert(r.clone(), 0);
        }
        (out, changed)
    }

    /// Devices held by containers, per resource.
    #[must_use]
    pub fn devices_in_use(&self) -> HashMap<String, BTreeSet<String>> {
        let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
        for containers in self.pod_devices.values() {
            for resources in containers.values() {
                for (r, d) in resources {
                    out.entry(r.clone()).or_default().extend(d.ids());
                }
            }
        }
        out
    }

    /// Drops the allocations of pods that are no longer active, except `admitting`'s
    /// (upstream `UpdateAllocatedDevices` with the pod pending admission).
    pub fn update_allocated_devices(&mut self, admitting: &str) {
        if let Some(active) = &self.active {
            let stale: Vec<String> = self
                .pod_devices
                .keys()
                .filter(|u| u.as_str() != admitting && !active.contains(u.as_str()))
                .cloned()
                .collect();
            for u in stale {
                tracing::debug!(pod_uid = %u, "releasing the devices of a pod that is no longer active");
                self.pod_devices.remove(&u);
            }
        }
        self.allocated = self.devices_in_use();
    }

    #[must_use]
    pub fn container_devices(&self, pod: &str, container: &str, resource: &str) -> Option<&ContainerDevices> {
        self.pod_devices.get(pod)?.get(container)?.get(resource)
    }

    /// The devices `pod` holds of `resource`, over all its containers.
    #[must_use]
    pub fn pod_resource_devices(&self, pod: &str, resource: &str) -> BTreeSet<String> {
        self.pod_devices
            .get(pod)
            .into_iter()
            .flat_map(|c| c.values())
            .filter_map(|r| r.get(resource))
            .flat_map(ContainerDevices::ids)
            .collect()
    }

    /// NUMA nodes of device `id` of `resource` (empty: no topology).
    #[must_use]
    pub fn numa_of(&self, resource: &str, id: &str) -> Vec<i64> {
        self.all_devices
            .get(resource)
            .and_then(|d| d.get(id))
            .and_then(|d| d.topology.as_ref())
            .map(|t| t.nodes.iter().map(|n| n.id).collect())
            .unwrap_or_default()
    }

    /// Whether any device of `resource` reports topology.
    #[must_use]
    pub fn has_topology(&self, resource: &str) -> bool {
        self.all_devices.get(resource).is_some_and(|d| d.values().any(|d| d.topology.is_some()))
    }

    /// Records `container`'s devices and the plugin's answer.
    pub fn insert(
        &mut self,
        pod: &str,
        container: &str,
        resource: &str,
        ids: &BTreeSet<String>,
        response: proto::ContainerAllocateResponse,
    ) {
        let mut by_numa: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for id in ids {
            let nodes = self.numa_of(resource, id);
            if nodes.is_empty() {
                by_numa.entry(NO_TOPOLOGY).or_default().push(id.clone());
            }
            for n in nodes {
                by_numa.entry(n).or_default().push(id.clone());
            }
        }
        self.pod_devices
            .entry(pod.to_owned())
            .or_default()
            .entry(container.to_owned())
            .or_default()
            .insert(resource.to_owned(), ContainerDevices { by_numa, response });
    }

    /// The checkpoint of this state.
    #[must_use]
    pub fn checkpoint(&self) -> CheckpointData {
        let mut entries = Vec::new();
        for (pod, containers) in &self.pod_devices {
            for (container, resources) in containers {
                for (resource, d) in resources {
                    entries.push(PodDevicesEntry {
                        pod_uid: pod.clone(),
                        container_name: container.clone(),
                        resource_name: resource.clone(),
                        device_ids: d.by_numa.clone(),
                        alloc_resp: d.response.encode_to_vec(),
                    });
                }
            }
        }
        CheckpointData {
            pod_device_entries: (!entries.is_empty()).then_some(entries),
            registered_devices: self.healthy.iter().map(|(r, d)| (r.clone(), d.iter().cloned().collect())).collect(),
        }
    }

    /// Restores a checkpoint (upstream `readCheckpoint`): allocations as they were, and
    /// every registered resource with no devices and a stopped endpoint, until its
    /// plugin registers again (or the grace period, counted from `now`, ends).
    pub fn restore(&mut self, data: CheckpointData, now: Instant) {
        for e in data.pod_device_entries.unwrap_or_default() {
            let response = proto::ContainerAllocateResponse::decode(e.alloc_resp.as_slice()).unwrap_or_default();
            self.pod_devices
                .entry(e.pod_uid)
                .or_default()
                .entry(e.container_name)
                .or_default()
                .insert(e.resource_name, ContainerDevices { by_numa: e.device_ids, response });
        }
        for r in data.registered_devices.into_keys() {
            self.healthy.entry(r.clone()).or_default();
            self.unhealthy.entry(r.clone()).or_default();
            self.next_generation += 1;
            self.endpoints.insert(
                r,
                Endpoint {
                    api: None,
                    options: proto::DevicePluginOptions::default(),
                    stopped_at: Some(now),
                    generation: self.next_generation,
                },
            );
        }
        self.allocated = self.devices_in_use();
    }
}
