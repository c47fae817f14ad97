//! The shutdown manager's kill through the pod workers: the same path as an eviction
//! (`PodWorkers::evict`: the pod stays, `Failed`, with a status override on every later
//! status), with the shutdown's reason, message and condition.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{BoxError, PodTerminator, apply_shutdown_status};
use crate::pod_workers::{PodWorkers, WorkerState};

/// Kills through the pod workers and waits (bounded) for the containers to stop.
#[derive(Debug)]
pub struct AgentTerminator {
    pub workers: PodWorkers,
}

#[async_trait]
impl PodTerminator for AgentTerminator {
    async fn terminate(&self, pod: &Pod, grace: i64) -> Result<(), BoxError> {
        let decided = Time(jiff::Timestamp::now());
        self.workers.evict(pod.clone(), grace, Arc::new(move |status| apply_shutdown_status(status, decided.clone())));
        let wait = Duration::from_secs(u64::try_from(grace).unwrap_or(0)) + Duration::from_secs(10);
        let deadline = tokio::time::Instant::now() + wait;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        while matches!(self.workers.states().get(&uid), Some(WorkerState::Syncing | WorkerState::Terminating)) {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("pod {uid} still running {wait:?} after its termination for the shutdown").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}
