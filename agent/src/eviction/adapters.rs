//! The eviction manager's view of the agent: stats from the stats provider, pods from the
//! pod manager and workers, kills through the pod workers, reclaim through container
//! and image GC (the traits of [`super::manager`]).

use crate::types::pod::uid as pod_uid;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::manager::{ActivePods, BoxError, Eviction, NodeReclaimer, PodKiller, StatsSource};
use super::observations::NodeSnapshot;
use crate::pod_manager::PodManager;
use crate::pod_workers::{PodWorkers, WorkerState};
use crate::status::StatusProvider;

/// How old disk usages may be when pods are ranked under disk pressure.
pub const FRESH_DISK_USAGE: Duration = Duration::from_secs(5);

/// Stats: a fresh collection per pass.
#[derive(Debug)]
pub struct AgentStats {
    pub provider: Arc<crate::stats::provider::StatsProvider>,
    /// The kubelet root directory (the node filesystem).
    pub root_dir: PathBuf,
}

#[async_trait]
impl StatsSource for AgentStats {
    async fn snapshot(&self) -> Result<NodeSnapshot, BoxError> {
        let dedicated = self.has_dedicated_image_fs().await.unwrap_or(false);
        let collection = self.provider.fresh_collection().await?;
        Ok(NodeSnapshot::from_summary(&collection.summary(), dedicated))
    }

    async fn snapshot_with_fresh_disk_usage(&self) -> Result<NodeSnapshot, BoxError> {
        let dedicated = self.has_dedicated_image_fs().await.unwrap_or(false);
        let collection = self.provider.fresh_collection_with_disk_usage(FRESH_DISK_USAGE).await?;
        Ok(NodeSnapshot::from_summary(&collection.summary(), dedicated))
    }

    async fn has_dedicated_image_fs(&self) -> Result<bool, BoxError> {
        use std::os::unix::fs::MetadataExt as _;
        let Some(images) = self.provider.image_fs_mountpoint().await else { return Ok(false) };
        let root = std::fs::metadata(&self.root_dir)?.dev();
        Ok(std::fs::metadata(&images)?.dev() != root)
    }
}

fn is_terminal(status: Option<&k8s_openapi::api::core::v1::PodStatus>) -> bool {
    matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Pods: the desired ones whose worker still runs them.
#[derive(Debug)]
pub struct AgentPods {
    pub manager: PodManager,
    pub workers: PodWorkers,
    pub status: Arc<dyn StatusProvider>,
}

impl ActivePods for AgentPods {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.manager
            .pods()
            .into_iter()
            .filter(|p| self.workers.is_running(pod_uid(p)) && !is_terminal(self.status.get(pod_uid(p)).as_ref()))
            .collect()
    }

    fn pod_cleaned_up(&self, pod: &Pod) -> bool {
        !matches!(self.workers.states().get(pod_uid(pod)), Some(WorkerState::Syncing | WorkerState::Terminating))
    }
}

/// Kills through the pod workers; the pod's status becomes the eviction's for good.
#[derive(Debug)]
pub struct AgentKiller {
    pub workers: PodWorkers,
}

#[async_trait]
impl PodKiller for AgentKiller {
    async fn kill_pod(&self, eviction: &Eviction) -> Result<(), BoxError> {
        let decided = Time(jiff::Timestamp::now());
        let evicted = eviction.clone();
        self.workers.evict(
            eviction.pod.clone(),
            eviction.grace_period_seconds,
            Arc::new(move |status| evicted.apply_to_status(status, decided.clone())),
        );
        // Wait (bounded) for the containers to stop, as upstream's killPodNow.
        let wait =
            Duration::from_secs(u64::try_from(eviction.grace_period_seconds).unwrap_or(0)) + Duration::from_secs(10);
        let deadline = tokio::time::Instant::now() + wait;
        let uid = pod_uid(&eviction.pod).to_owned();
        while matches!(self.workers.states().get(&uid), Some(WorkerState::Syncing | WorkerState::Terminating)) {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("pod {uid} still running {wait:?} after its eviction").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// Reclaim: container GC including terminated pods, image GC of every unused image.
#[derive(Debug)]
pub struct AgentReclaimer {
    pub containers: Arc<crate::gc::ContainerGc>,
    pub images: Option<Arc<crate::images::gc::ImageGcManager>>,
}

#[async_trait]
impl NodeReclaimer for AgentReclaimer {
    async fn delete_all_unused_containers(&self) -> Result<(), BoxError> {
        self.containers.collect_for_eviction(SystemTime::now()).await?;
        Ok(())
    }

    async fn delete_unused_images(&self) -> Result<(), BoxError> {
        if let Some(images) = &self.images {
            images.delete_unused_images().await?;
        }
        Ok(())
    }
}
