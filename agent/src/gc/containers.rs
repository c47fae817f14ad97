//! The container and sandbox collector (see the module docs of [`crate::gc`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as api;
use tokio_util::sync::CancellationToken;

use super::ContainerGcPolicy;
use crate::container::RuntimeService;
use crate::container::labels;

/// Which pods still matter to the collector.
pub trait PodPresence: Send + Sync + std::fmt::Debug {
    /// Every pod source has reported at least once (before that, no pod counts as gone).
    fn sources_ready(&self) -> bool;
    /// The pod is neither desired nor being worked on: its runtime leftovers may all go
    /// (upstream `ShouldPodContentBeRemoved`).
    fn is_gone(&self, pod_uid: &str) -> bool;
    /// The pod is terminated for good (evicted, or finished and not restarting): under
    /// disk pressure its dead containers may all go too (upstream
    /// `ShouldPodRuntimeBeRemoved`).
    fn is_terminated(&self, _pod_uid: &str) -> bool {
        false
    }
}

/// A dead container, as the collector sees it.
#[derive(Debug, Clone)]
struct Dead {
    id: String,
    created: i64,
}

/// Removes dead containers and sandboxes (see [`crate::gc`]).
#[derive(Debug)]
pub struct ContainerGc {
    runtime: Arc<dyn RuntimeService>,
    pods: Arc<dyn PodPresence>,
    policy: ContainerGcPolicy,
}

fn nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl ContainerGc {
    #[must_use]
    pub fn new(runtime: Arc<dyn RuntimeService>, pods: Arc<dyn PodPresence>, policy: ContainerGcPolicy) -> Self {
        Self { runtime, pods, policy }
    }

    /// Collects every `period` until `shutdown`.
    pub async fn run(self: Arc<Self>, period: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(e) = self.collect(SystemTime::now()).await {
                        tracing::warn!(error = %e, "container garbage collection");
                    }
                }
            }
        }
    }

    /// One pass at `now`; returns how many containers and sandboxes were removed.
    ///
    /// # Errors
    /// Listing containers or sandboxes failed.
    pub async fn collect(&self, now: SystemTime) -> crate::container::Result<(usize, usize)> {
        self.collect_with(now, false).await
    }

    /// Upstream `DeleteAllUnusedContainers` (the eviction manager's reclaim under disk
    /// pressure): [`Self::collect`], with the pods that are terminated for good treated
    /// as gone.
    ///
    /// # Errors
    /// Listing containers or sandboxes failed.
    pub async fn collect_for_eviction(&self, now: SystemTime) -> crate::container::Result<(usize, usize)> {
        self.collect_with(now, true).await
    }

    async fn collect_with(&self, now: SystemTime, terminated_too: bool) -> crate::container::Result<(usize, usize)> {
        let containers = self.runtime.list_containers(None).await?;
        let removed_containers = self.evict_containers(&containers, now, terminated_too).await;
        let remaining = self.runtime.list_containers(None).await?;
        let removed_sandboxes = self.evict_sandboxes(&remaining, terminated_too).await?;
        if removed_containers + removed_sandboxes > 0 {
            tracing::info!(containers = removed_containers, sandboxes = removed_sandboxes, "garbage collected");
        }
        Ok((removed_containers, removed_sandboxes))
    }

    fn removable(&self, uid: &str, terminated_too: bool) -> bool {
        self.pods.is_gone(uid) || terminated_too && self.pods.is_terminated(uid)
    }

    async fn evict_containers(&self, containers: &[api::Container], now: SystemTime, terminated_too: bool) -> usize {
        let newest_gc_time =
            nanos(now).saturating_sub(i64::try_from(self.policy.min_age.as_nanos()).unwrap_or(i64::MAX));
        // Dead containers per (pod UID, container name), newest first.
        let mut units: HashMap<(String, String), Vec<Dead>> = HashMap::new();
        for c in containers {
            if c.state == api::ContainerState::ContainerRunning as i32 || c.created_at > newest_gc_time {
                continue;
            }
            let (Some(uid), Some(name)) = (c.labels.get(labels::POD_UID), c.labels.get(labels::CONTAINER_NAME)) else {
                continue;
            };
            units
                .entry((uid.clone(), name.clone()))
                .or_default()
                .push(Dead { id: c.id.clone(), created: c.created_at });
        }
        for unit in units.values_mut() {
            unit.sort_by_key(|d| std::cmp::Reverse(d.created));
        }
        let mut removed = 0;
        if self.pods.sources_ready() {
            let gone: Vec<(String, String)> =
                units.keys().filter(|(uid, _)| self.removable(uid, terminated_too)).cloned().collect();
            for key in gone {
                if let Some(unit) = units.remove(&key) {
                    removed += self.remove_containers(&unit).await;
                }
            }
        }
        if let Ok(max) = usize::try_from(self.policy.max_per_pod_container) {
            removed += self.keep_per_unit(&mut units, max).await;
        }
        if let Ok(max) = usize::try_from(self.policy.max_containers) {
            let total: usize = units.values().map(Vec::len).sum();
            if total > max {
                let per_unit = (max / units.len().max(1)).max(1);
                removed += self.keep_per_unit(&mut units, per_unit).await;
                let mut flat: Vec<Dead> = units.values().flatten().cloned().collect();
                if flat.len() > max {
                    flat.sort_by_key(|d| std::cmp::Reverse(d.created));
                    removed += self.remove_containers(&flat[max..]).await;
                }
            }
        }
        removed
    }

    /// Cuts every unit to its newest `keep`.
    async fn keep_per_unit(&self, units: &mut HashMap<(String, String), Vec<Dead>>, keep: usize) -> usize {
        let mut removed = 0;
        for unit in units.values_mut() {
            if unit.len() > keep {
                removed += self.remove_containers(&unit[keep..]).await;
                unit.truncate(keep);
            }
        }
        removed
    }

    /// Removes `dead` (its log first, as upstream); returns how many went.
    async fn remove_containers(&self, dead: &[Dead]) -> usize {
        let mut removed = 0;
        for d in dead {
            match self.runtime.container_status(&d.id).await {
                Ok(status) if !status.log_path.is_empty() => {
                    if let Err(e) = std::fs::remove_file(&status.log_path)
                        && e.kind() != std::io::ErrorKind::NotFound
                    {
                        tracing::warn!(container = %d.id, path = %status.log_path, error = %e, "removing a dead container's log");
                    }
                }
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::debug!(container = %d.id, error = %e, "status of a dead container"),
            }
            match self.runtime.remove_container(&d.id).await {
                Ok(()) => removed += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(container = %d.id, error = %e, "removing a dead container"),
            }
        }
        removed
    }

    async fn evict_sandboxes(
        &self,
        containers: &[api::Container],
        terminated_too: bool,
    ) -> crate::container::Result<usize> {
        let with_containers: HashSet<&str> = containers.iter().map(|c| c.pod_sandbox_id.as_str()).collect();
        let mut by_pod: HashMap<String, Vec<(String, i64, bool)>> = HashMap::new();
        for s in self.runtime.list_pod_sandbox(None).await? {
            let Some(uid) = s.metadata.as_ref().map(|m| m.uid.clone()).filter(|u| !u.is_empty()) else { continue };
            let active =
                s.state == api::PodSandboxState::SandboxReady as i32 || with_containers.contains(s.id.as_str());
            by_pod.entry(uid).or_default().push((s.id, s.created_at, active));
        }
        let sources_ready = self.pods.sources_ready();
        let mut removed = 0;
        for (uid, mut sandboxes) in by_pod {
            sandboxes.sort_by_key(|(_, created, _)| std::cmp::Reverse(*created));
            let keep = usize::from(!(sources_ready && self.removable(&uid, terminated_too)));
            for (id, _, active) in sandboxes.iter().skip(keep) {
                if *active {
                    continue;
                }
                match self.runtime.remove_pod_sandbox(id).await {
                    Ok(()) => removed += 1,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => tracing::warn!(sandbox = %id, error = %e, "removing a dead sandbox"),
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
