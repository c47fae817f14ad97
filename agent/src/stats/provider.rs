//! [`StatsProvider`]: what the agent knows about its pods, turned into an [`Inventory`]
//! for the [`Collector`], collected on demand for `/stats/summary` and `/metrics/resource`.
//!
//! The inventory comes from the pod manager (names), the volume manager (the volumes it
//! set up), one CRI `ListPodSandbox` and
//! one `ListContainers` (ids, creation times, images; no `ListContainerStats`, which costs
//! about a second at 250 pods), and the cgroup paths the agent itself chose
//! (`cgroup_parent` of the pod, the container id under it). Collections are made when
//! asked for, not on a timer, so an idle node spends nothing on them; one younger than
//! [`REUSE`] is served again, so that concurrent scrapes share the work.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::{Collection, Collector, ContainerInventory, Inventory, PodInventory, VolumeInventory};
use crate::cm::PodContainerManager;
use crate::pod_manager::PodManager;
use crate::runtime::pod_status::time_from_nanos;
use crate::runtime::{RuntimeService, api, labels};
use crate::volumes::VolumeManager;

/// A collection this young is served again instead of collecting anew.
pub const REUSE: Duration = Duration::from_secs(1);

/// Where the agent keeps what the stats need.
#[derive(Debug, Clone)]
pub struct StatsSettings {
    pub node_name: String,
    /// `--root-dir` (its filesystem is the node's `fs`; pod directories are under it).
    pub root_dir: PathBuf,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
    /// `<cgroupRoot>/kubepods` relative to the hierarchy roots; `None` without `QoS` cgroups.
    pub pods_cgroup: Option<String>,
}

/// Collects stats on demand (see the module docs).
pub struct StatsProvider {
    settings: StatsSettings,
    collector: Arc<Mutex<Collector>>,
    runtime: Arc<dyn RuntimeService>,
    pods: PodManager,
    cm: Arc<dyn PodContainerManager>,
    volumes: Arc<VolumeManager>,
    last: tokio::sync::Mutex<Option<(Instant, Arc<Collection>)>>,
}

impl std::fmt::Debug for StatsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsProvider").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The pod's volumes as the volume manager set them up (plugin, path, medium), with
/// upstream's `IsLocalEphemeralVolume` (emptyDir not in memory, configMap) deciding what
/// counts as the pod's ephemeral storage. Host paths have no stats upstream either.
fn pod_volumes(volumes: &VolumeManager, uid: &str) -> Vec<VolumeInventory> {
    use crate::volumes::manager::Plugin;
    volumes
        .mounted_volumes(uid)
        .iter()
        .flat_map(crate::volumes::manager::PodVolumes::iter)
        .filter(|v| v.plugin != Plugin::HostPath)
        .map(|v| VolumeInventory {
            name: v.name.clone(),
            path: v.path.clone(),
            local_ephemeral: (v.plugin == Plugin::EmptyDir && !v.memory) || v.plugin == Plugin::ConfigMap,
            pvc: None,
        })
        .collect()
}

impl StatsProvider {
    #[must_use]
    pub fn new(
        settings: StatsSettings,
        collector: Collector,
        runtime: Arc<dyn RuntimeService>,
        pods: PodManager,
        cm: Arc<dyn PodContainerManager>,
        volumes: Arc<VolumeManager>,
    ) -> Self {
        Self {
            settings,
            collector: Arc::new(Mutex::new(collector)),
            runtime,
            pods,
            cm,
            volumes,
            last: tokio::sync::Mutex::default(),
        }
    }

    /// Builds the inventory from the pod manager and one listing of the runtime.
    async fn inventory(&self) -> crate::runtime::Result<Inventory> {
        let ready = api::PodSandboxState::SandboxReady as i32;
        let running = api::ContainerState::ContainerRunning as i32;
        let sandboxes = self.runtime.list_pod_sandbox(None).await?;
        let containers = self.runtime.list_containers(None).await?;
        let mut by_pod: HashMap<String, Vec<&api::Container>> = HashMap::new();
        for c in containers.iter().filter(|c| c.state == running) {
            if let Some(uid) = c.labels.get(labels::POD_UID) {
                by_pod.entry(uid.clone()).or_default().push(c);
            }
        }
        let desired: HashMap<String, Pod> =
            self.pods.pods().into_iter().filter_map(|p| p.metadata.uid.clone().map(|u| (u, p))).collect();
        let mut pods = Vec::new();
        for sb in sandboxes.iter().filter(|s| s.state == ready) {
            let Some(uid) = sb.labels.get(labels::POD_UID) else { continue };
            let Some(pod) = desired.get(uid) else { continue };
            let cgroup = self.cm.cgroup_parent(pod);
            let name = pod.metadata.name.clone().unwrap_or_default();
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let log_dir = self.settings.pod_logs_dir.join(format!("{namespace}_{name}_{uid}"));
            let etc_hosts = self.settings.root_dir.join("pods").join(uid).join("etc-hosts");
            let containers = by_pod
                .get(uid)
                .into_iter()
                .flatten()
                .filter(|c| c.pod_sandbox_id == sb.id)
                .map(|c| {
                    let cname = c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
                    ContainerInventory {
                        log_dir: Some(log_dir.join(&cname)),
                        name: cname,
                        id: c.id.clone(),
                        cgroup: format!("{cgroup}/{}", c.id),
                        start_time: time_from_nanos(c.created_at),
                        image: c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
                        writable_layer: None,
                    }
                })
                .collect();
            pods.push(PodInventory {
                uid: uid.clone(),
                name,
                namespace,
                sandbox_cgroup: Some(format!("{cgroup}/{}", sb.id)),
                cgroup,
                start_time: time_from_nanos(sb.created_at),
                sandbox_id: sb.id.clone(),
                log_dir: Some(log_dir),
                etc_hosts: etc_hosts.exists().then_some(etc_hosts),
                volumes: pod_volumes(&self.volumes, uid),
                containers,
            });
        }
        Ok(Inventory {
            node_name: self.settings.node_name.clone(),
            pods_cgroup: self.settings.pods_cgroup.clone(),
            system_containers: Vec::new(),
            root_fs_path: self.settings.root_dir.clone(),
            image_fs: None,
            pods,
        })
    }

    /// A collection no older than [`REUSE`].
    ///
    /// # Errors
    /// When the runtime cannot be listed.
    pub async fn collection(&self) -> crate::runtime::Result<Arc<Collection>> {
        let mut last = self.last.lock().await;
        if let Some((at, c)) = last.as_ref()
            && at.elapsed() < REUSE
        {
            return Ok(c.clone());
        }
        let inventory = self.inventory().await?;
        let collector = self.collector.clone();
        // File reads: off the async workers.
        let collection = tokio::task::spawn_blocking(move || collector.lock().unwrap().collect(&inventory))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let collection = Arc::new(collection);
        *last = Some((Instant::now(), collection.clone()));
        Ok(collection)
    }
}
