//! [`StatsProvider`]: what the agent knows about its pods, turned into an [`Inventory`]
//! for the [`Collector`], collected on demand for `/stats/summary` and `/metrics/resource`.
//!
//! The inventory comes from the pod manager (names), the volume manager (the volumes it
//! set up), one CRI `ListPodSandbox` and
//! one `ListContainers` (ids, creation times, images; no `ListContainerStats`, which costs
//! about a second at 250 pods), CRI `ImageFsInfo` (one call, reused for [`IMAGE_FS_REUSE`]),
//! and the cgroup paths the agent itself chose (`cgroup_parent` of the pod, the container
//! id under it). Log directories are the CRI log paths the runtime manager gives
//! containers (`<podLogsDir>/<namespace>_<name>_<uid>/<container>/<restart>.log`); writable
//! layers are found by the collector from the containers' own mount tables.
//!
//! When are collections made: with [`StatsProvider::with_housekeeping`] (what the agent
//! does), like cAdvisor's housekeeping but only while someone reads the stats: the first
//! request after a quiet spell collects, and from then on [`StatsProvider::run_housekeeping`]
//! collects every [`HOUSEKEEPING_INTERVAL`] (10 s, the kubelet's cAdvisor setting) for as
//! long as requests keep coming ([`HOUSEKEEPING_IDLE`]); requests are served the latest
//! collection, at most an interval and a half old. A scrape then costs only its
//! rendering, as upstream's do, and a node nobody scrapes spends nothing. Without
//! housekeeping, a collection younger than [`REUSE`] is served again, so that concurrent
//! scrapes share the work. The eviction manager always asks for a fresh one. What renders
//! where it cannot wait (the log usage family of `/metrics`) takes
//! [`StatsProvider::latest`]: the latest collection if it is recent enough, else nothing
//! and a wake-up for housekeeping.
//! Directory walks (writable layers, volumes) happen only in the background task
//! [`StatsProvider::fs_usage`] runs; the agent spawns it.

use std::collections::HashMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use tokio::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::{
    Collection, Collector, ContainerInventory, DriverVolume, DriverVolumeStats, FsUsageCache, ImageFsInventory,
    Inventory, PodInventory, VolumeInventory, VolumeStatsSource,
};
use crate::cm::PodContainerManager;
use crate::container::pod_status::time_from_nanos;
use crate::container::{RuntimeService, api, labels};
use crate::pod_manager::PodManager;
use crate::volumes::VolumeManager;

/// The latest collection, and what it was made from.
#[derive(Debug)]
struct Latest {
    /// When it was made.
    at: Instant,
    /// The [`StatsProvider::container_changes`] count it saw.
    changes: u64,
    /// Whether it walked the processes.
    walked: bool,
    collection: Arc<Collection>,
}

/// A collection this young is served again instead of collecting anew (without
/// housekeeping).
pub const REUSE: Duration = Duration::from_secs(1);

/// How often housekeeping collects while the stats are being read.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);

/// Housekeeping stops this long after the last request.
pub const HOUSEKEEPING_IDLE: Duration = Duration::from_mins(2);

/// An `ImageFsInfo` answer this young is used again instead of asking the runtime.
pub const IMAGE_FS_REUSE: Duration = Duration::from_secs(10);

/// The image filesystem from an `ImageFsInfo` answer: the first image filesystem, as
/// upstream 1.28 reports only that one (`ImageFsStats`).
#[must_use]
pub fn image_fs_inventory(response: &api::ImageFsInfoResponse) -> Option<ImageFsInventory> {
    let fs = response.image_filesystems.first()?;
    let mountpoint = fs.fs_id.as_ref().map(|id| id.mountpoint.as_str()).filter(|m| !m.is_empty())?;
    Some(ImageFsInventory {
        mountpoint: Path::new(mountpoint).to_path_buf(),
        used_bytes: fs.used_bytes.as_ref().map(|v| v.value),
        inodes_used: fs.inodes_used.as_ref().map(|v| v.value),
        time: u64::try_from(fs.timestamp).ok().filter(|&n| n > 0).map(|n| UNIX_EPOCH + Duration::from_nanos(n)),
    })
}

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
    fs_usage: Arc<FsUsageCache>,
    /// Held while collecting: one collection at a time.
    collecting: tokio::sync::Mutex<()>,
    /// The latest collection.
    latest: std::sync::Mutex<Option<Latest>>,
    /// Bumped by whoever sees containers start or stop (the runtime manager and the sync
    /// loop, on PLEG events).
    changes: Arc<std::sync::atomic::AtomicU64>,
    /// Wakes housekeeping when a reader found no recent collection.
    wake: tokio::sync::Notify,
    image_fs: tokio::sync::Mutex<Option<(Instant, Option<ImageFsInventory>)>>,
    image_fs_warned: AtomicBool,
    /// Housekeeping interval, if housekeeping runs.
    housekeeping: Option<Duration>,
    /// When the stats were last asked for (housekeeping runs while this is recent).
    last_request: std::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for StatsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsProvider").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The pod's volumes as the volume manager set them up (plugin, path, medium), with
/// upstream's `IsLocalEphemeralVolume` (emptyDir not in memory, configMap) deciding what
/// counts as the pod's ephemeral storage. Host paths have no stats upstream either.
fn pod_volumes(volumes: &VolumeManager, uid: &str, namespace: &str) -> Vec<VolumeInventory> {
    use crate::volumes::manager::Plugin;
    volumes
        .mounted_volumes(uid)
        .iter()
        .flat_map(crate::volumes::manager::PodVolumes::iter)
        .filter(|v| !matches!(v.plugin, Plugin::HostPath | Plugin::Image))
        .map(|v| VolumeInventory {
            name: v.name.clone(),
            path: v.path.clone(),
            local_ephemeral: (v.plugin == Plugin::EmptyDir && !v.memory) || v.plugin == Plugin::ConfigMap,
            pvc: v
                .claim
                .as_ref()
                .map(|name| super::summary::PvcReference { name: name.clone(), namespace: namespace.to_owned() }),
            // CSI volumes, block ones too, are measured by their driver.
            driver: v
                .csi
                .as_ref()
                .map(|c| DriverVolume { driver: c.driver.clone(), volume_id: c.volume_handle.clone() }),
        })
        .collect()
}

/// The CSI drivers as the source of CSI volumes' figures.
struct CsiVolumeStats(Arc<crate::volumes::csi::CsiDrivers>);

impl VolumeStatsSource for CsiVolumeStats {
    fn volume_stats(&self, volume: &DriverVolume, path: &Path) -> Result<Option<DriverVolumeStats>, String> {
        let usage = self.0.volume_stats_blocking(&volume.driver, &volume.volume_id, path).map_err(|e| e.to_string())?;
        Ok(usage.map(|u| DriverVolumeStats {
            fs: super::fs::FsInfo {
                capacity: u.capacity,
                available: u.available,
                usage: u.used,
                inodes: u.inodes,
                inodes_free: u.inodes_free,
            },
            usage: super::fs::DiskUsage { bytes: u.used, inodes: u.inodes_used },
        }))
    }
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
        let fs_usage = collector.fs_usage();
        fs_usage.set_volume_stats_source(Arc::new(CsiVolumeStats(Arc::clone(volumes.csi()))));
        Self {
            settings,
            fs_usage,
            collector: Arc::new(Mutex::new(collector)),
            runtime,
            pods,
            cm,
            volumes,
            collecting: tokio::sync::Mutex::default(),
            latest: std::sync::Mutex::default(),
            wake: tokio::sync::Notify::new(),
            changes: Arc::default(),
            image_fs: tokio::sync::Mutex::default(),
            image_fs_warned: AtomicBool::new(false),
            housekeeping: None,
            last_request: std::sync::Mutex::default(),
        }
    }

    /// Serves collections made by [`Self::run_housekeeping`] every `every` while the
    /// stats are being read (see the module docs).
    #[must_use]
    pub fn with_housekeeping(mut self, every: Duration) -> Self {
        self.housekeeping = Some(every);
        self
    }

    /// Collects every housekeeping interval while requests keep coming, until `shutdown`.
    pub async fn run_housekeeping(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let Some(every) = self.housekeeping else { return };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
                () = self.wake.notified() => {}
            }
            let wanted = self.read_recently();
            // The eviction manager collects every 10 s too: one recent enough will do.
            let recent = self.latest_within(every / 2, true).is_some();
            if wanted
                && !recent
                && let Err(e) = self.fresh_collection().await
            {
                tracing::debug!(error = %e, "stats housekeeping");
            }
        }
    }

    /// The `du` cache of writable layers and volumes; spawn its
    /// [`run`](FsUsageCache::run) once, or those usages stay unknown.
    #[must_use]
    pub fn fs_usage(&self) -> Arc<FsUsageCache> {
        Arc::clone(&self.fs_usage)
    }

    /// The image filesystem, from an `ImageFsInfo` answer at most [`IMAGE_FS_REUSE`] old.
    /// Without an answer (an error is logged once as a warning) the node has no
    /// `runtime.imageFs` and writable layers take their capacity from the root filesystem.
    async fn image_fs(&self) -> Option<ImageFsInventory> {
        let mut cached = self.image_fs.lock().await;
        if let Some((at, fs)) = cached.as_ref()
            && at.elapsed() < IMAGE_FS_REUSE
        {
            return fs.clone();
        }
        let fs = match self.runtime.image_fs_info().await {
            Ok(r) => {
                let fs = image_fs_inventory(&r);
                if fs.is_none() {
                    tracing::debug!("stats: ImageFsInfo named no image filesystem");
                }
                fs
            }
            Err(e) => {
                if self.image_fs_warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!(error = %e, "stats: ImageFsInfo failed");
                } else {
                    tracing::warn!(error = %e, "stats: ImageFsInfo failed; no image filesystem stats");
                }
                None
            }
        };
        *cached = Some((Instant::now(), fs.clone()));
        fs
    }

    /// Builds the inventory from the pod manager and one listing of the runtime.
    async fn inventory(&self) -> crate::container::Result<Inventory> {
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
        let desired: HashMap<String, Arc<Pod>> =
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
                        cgroup: self.cm.container_cgroup(&cgroup, &c.id),
                        start_time: time_from_nanos(c.created_at),
                        image: c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
                        writable_layer: None,
                    }
                })
                .collect();
            pods.push(PodInventory {
                uid: uid.clone(),
                name,
                sandbox_cgroup: Some(format!("{cgroup}/{}", sb.id)),
                cgroup,
                start_time: time_from_nanos(sb.created_at),
                sandbox_id: sb.id.clone(),
                log_dir: Some(log_dir),
                etc_hosts: etc_hosts.exists().then_some(etc_hosts),
                volumes: pod_volumes(&self.volumes, uid, &namespace),
                namespace,
                containers,
            });
        }
        Ok(Inventory {
            node_name: self.settings.node_name.clone(),
            pods_cgroup: self.settings.pods_cgroup.clone(),
            system_containers: Vec::new(),
            root_fs_path: self.settings.root_dir.clone(),
            image_fs: self.image_fs().await,
            pods,
        })
    }

    /// A collection no older than [`REUSE`] (or, with housekeeping, than an interval and a
    /// half).
    ///
    /// # Errors
    /// When the runtime cannot be listed.
    pub async fn collection(&self) -> crate::container::Result<Arc<Collection>> {
        *self.last_request.lock().unwrap() = Some(Instant::now());
        self.collection_within(self.max_age(), true).await
    }

    /// A collection made now (the eviction manager's: each of its passes must see newer
    /// stats than the last); it also serves the next scrapes for [`REUSE`]. While the
    /// stats are being read ([`HOUSEKEEPING_IDLE`]) it is a full one, processes walked
    /// (descriptors, sockets: `/metrics/cadvisor` alone shows them); otherwise it is lean
    /// ([`Collector::set_lean`]: what the eviction manager reads, a third of the file
    /// reads), and a reader never gets it.
    ///
    /// # Errors
    /// When the runtime cannot be listed.
    pub async fn fresh_collection(&self) -> crate::container::Result<Arc<Collection>> {
        self.collection_within(Duration::ZERO, false).await
    }

    /// Whether the stats were asked for within [`HOUSEKEEPING_IDLE`].
    fn read_recently(&self) -> bool {
        self.last_request.lock().unwrap().is_some_and(|t| t.elapsed() < HOUSEKEEPING_IDLE)
    }

    /// A collection made now whose disk usages (writable layers, logs, volumes) are no
    /// older than `max_age`: what the background walks have not measured since is walked
    /// first (see [`FsUsageCache::refresh_older_than`]). Paths are known to the walks once
    /// a collection has seen them: call it after one (the eviction manager's pass starts
    /// with [`Self::fresh_collection`]).
    ///
    /// # Errors
    /// When the runtime cannot be listed.
    pub async fn fresh_collection_with_disk_usage(
        &self,
        max_age: Duration,
    ) -> crate::container::Result<Arc<Collection>> {
        let usage = Arc::clone(&self.fs_usage);
        let walked = tokio::task::spawn_blocking(move || usage.refresh_older_than(max_age))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        tracing::debug!(walked, "stats: disk usage refreshed");
        self.fresh_collection().await
    }

    /// The mount point of the runtime's image filesystem, if it reports one.
    pub async fn image_fs_mountpoint(&self) -> Option<std::path::PathBuf> {
        self.image_fs().await.map(|fs| fs.mountpoint)
    }

    /// Shares `changes` as [`Self::container_changes`].
    #[must_use]
    pub fn with_container_changes(mut self, changes: Arc<std::sync::atomic::AtomicU64>) -> Self {
        self.changes = changes;
        self
    }

    /// The counter to bump when containers start or stop: a collection made before a
    /// change is not served again (a pod that just started shows in the next scrape, as
    /// with cAdvisor, which watches cgroups being created).
    #[must_use]
    pub fn container_changes(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.changes)
    }

    /// The latest collection, if one younger than [`Self::collection`] serves exists,
    /// without collecting or waiting: for what renders while it cannot wait (the
    /// `/metrics` collectors, [`super::log_metrics`]). It counts as a request; when there
    /// is no recent collection, housekeeping is woken to make one (without housekeeping,
    /// only one made for another request less than [`REUSE`] ago is found).
    pub fn latest(&self) -> Option<Arc<Collection>> {
        *self.last_request.lock().unwrap() = Some(Instant::now());
        let latest = self.latest_within(self.max_age(), true);
        if latest.is_none() {
            self.wake.notify_one();
        }
        latest
    }

    /// How old a collection [`Self::collection`] serves may be.
    fn max_age(&self) -> Duration {
        self.housekeeping.map_or(REUSE, |every| every + every / 2)
    }

    /// The latest collection if younger than `max_age`, made after the last container
    /// change, and with the processes walked if `processes`.
    fn latest_within(&self, max_age: Duration, processes: bool) -> Option<Arc<Collection>> {
        let changes = self.changes.load(Ordering::Acquire);
        let latest = self.latest.lock().unwrap();
        latest
            .as_ref()
            .filter(|l| l.at.elapsed() < max_age && l.changes == changes && (l.walked || !processes))
            .map(|l| Arc::clone(&l.collection))
    }

    /// A collection no older than `max_age`, with the processes walked if `processes` (or
    /// if the stats are being read: see [`Self::fresh_collection`]).
    async fn collection_within(&self, max_age: Duration, processes: bool) -> crate::container::Result<Arc<Collection>> {
        let _collecting = self.collecting.lock().await;
        if let Some(c) = self.latest_within(max_age, processes) {
            return Ok(c);
        }
        let walk = processes || self.read_recently();
        // The count before listing: a change during the collection makes it stale at once.
        let changes = self.changes.load(Ordering::Acquire);
        let inventory = self.inventory().await?;
        let collector = self.collector.clone();
        // File reads: off the async workers.
        let collection = tokio::task::spawn_blocking(move || {
            let mut collector = collector.lock().unwrap();
            collector.set_process_walk(walk);
            // A collection without the walk is never served to a reader: only what the
            // eviction manager reads is needed.
            collector.set_lean(!walk);
            collector.collect(&inventory)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let collection = Arc::new(collection);
        *self.latest.lock().unwrap() =
            Some(Latest { at: Instant::now(), changes, walked: walk, collection: collection.clone() });
        Ok(collection)
    }
}
