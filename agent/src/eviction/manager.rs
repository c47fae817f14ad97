//! [`EvictionManager`]: upstream's `managerImpl` (`eviction_manager.go`) over injected
//! interfaces: stats ([`StatsSource`]), pods ([`ActivePods`]), the kill ([`PodKiller`]),
//! node-level reclaim ([`NodeReclaimer`]), events ([`EventRecorder`]) and metrics.
//!
//! # The loop ([`EvictionManager::run`])
//! A state machine with two states:
//! - **Monitoring**: wait for the next periodic pass (10 s after the previous one,
//!   upstream's `monitoringInterval`), a kernel pressure signal ([`PressureSignal`]:
//!   PSI, memcg or eBPF reclaim events the agent feeds in), or shutdown. Signals queued
//!   meanwhile are coalesced into one pass, timed from the earliest. Every pass is a
//!   [`EvictionManager::synchronize`]; a pass that evicts a pod moves to *Cleanup*, any
//!   other stays here.
//! - **Cleanup**: wait until the evicted pod's resources are reclaimed
//!   ([`ActivePods::pod_cleaned_up`], polled every second) or 30 s passed
//!   (`waitForPodsCleanup`), then run the next pass at once; signals that arrived during
//!   the wait are dropped, as that pass reads fresh stats anyway.
//!
//! # One pass ([`EvictionManager::synchronize`])
//! Upstream's `synchronize`: observe, find the thresholds met (those met before stay met
//! until their minimum reclaim is achieved), track when each was first met (soft
//! thresholds act after their grace period) and when each node condition was last seen
//! (conditions stay for `evictionPressureTransitionPeriod`), keep only thresholds whose
//! stats are newer than the previous pass's, pick the first threshold (memory first),
//! reclaim node-level resources for disk signals (container and image GC; enough freed
//! means no eviction), rank the pods and evict the first one that is not critical.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{EventRecorder, EventType, node_ref, pod_ref};
use crate::lifecycle::admission::Rejection;
use crate::pressure::PressureSignal;
use crate::types::pod::is_critical_pod;

use super::evaluate::{
    ConditionsObservedAt, ReclaimFunction, ThresholdsObservedAt, merge_thresholds, node_conditions,
    node_conditions_last_observed_at, node_conditions_observed_since, node_reclaim_functions,
    sort_by_eviction_priority, thresholds_first_observed_at, thresholds_met, thresholds_met_grace_period,
    thresholds_updated_stats,
};
use super::local_storage::{self, LocalStorageLimit};
use super::messages::{REASON, admit, apply_eviction_status, disruption_target_condition, eviction_message};
use super::metrics::{EvictionMetrics, SignalLabels, SourceLabels};
use super::observations::{NodeSnapshot, Observations, make_observations};
use super::ranking::{Ranking, rank};
use super::thresholds::{EvictionConfig, NodeCondition, Resource, Signal, Threshold, with_container_fs_thresholds};

/// Upstream's `monitoringInterval`: the period of the eviction manager's passes.
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// How long to wait for an evicted pod to be cleaned up (`podCleanupTimeout`).
pub const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often to check it (`podCleanupPollFreq`).
pub const POD_CLEANUP_POLL: Duration = Duration::from_secs(1);
/// `terminationGracePeriodSeconds` when a pod has none (the API default).
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// Errors of the injected interfaces (their own types, boxed).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the stats come from (upstream's `SummaryProvider` + `DiskInfoProvider`).
#[async_trait]
pub trait StatsSource: Send + Sync {
    /// Fresh stats (upstream `Get(ctx, updateStats=true)`): a pass with stats no newer
    /// than the previous pass's does not evict.
    async fn snapshot(&self) -> Result<NodeSnapshot, BoxError>;

    /// Whether the runtime's image filesystem is another device than the kubelet's root
    /// filesystem (`HasDedicatedImageFs`). Asked until it answers, then never again.
    async fn has_dedicated_image_fs(&self) -> Result<bool, BoxError>;

    /// Stats whose disk usage (writable layers, logs, volumes) was measured just now,
    /// for ranking pods under disk pressure. Those usages come from background `du`
    /// walks a minute or two apart (as upstream's), which can miss what a pod wrote since
    /// and rank the wrong pod first; the agent walks again what is older than a few
    /// seconds. By default, [`Self::snapshot`].
    async fn snapshot_with_fresh_disk_usage(&self) -> Result<NodeSnapshot, BoxError> {
        self.snapshot().await
    }
}

/// The pods (upstream's `ActivePodsFunc` and `PodCleanedUpFunc`).
pub trait ActivePods: Send + Sync {
    /// Pods admitted and not yet terminated: the eviction candidates (shared with the
    /// pod manager, not copied: every pass reads them).
    fn active_pods(&self) -> Vec<Arc<Pod>>;

    /// Whether an evicted pod's containers are gone and its volumes and cgroup cleaned up
    /// (upstream `podResourcesAreReclaimed`).
    fn pod_cleaned_up(&self, pod: &Pod) -> bool;
}

/// Kills an evicted pod (upstream `killPodNow` / `TerminatePodAbnormallyAndWait`).
#[async_trait]
pub trait PodKiller: Send + Sync {
    /// Stops the pod with [`Eviction::grace_period_seconds`] (0: at once, without the
    /// pod's own grace period) and sets its status with [`Eviction::apply_to_status`]
    /// (phase `Failed`, reason `Evicted`, the message, the `DisruptionTarget` condition).
    /// Returns once the pod's containers are stopped, or with an error (logged; the pod
    /// still counts as evicted, as upstream).
    async fn kill_pod(&self, eviction: &Eviction) -> Result<(), BoxError>;
}

/// Node-level reclaim before evicting pods for disk pressure (upstream `ContainerGC`,
/// `ImageGC`).
#[async_trait]
pub trait NodeReclaimer: Send + Sync {
    /// Removes every dead container and sandbox regardless of age and count limits
    /// (`DeleteAllUnusedContainers`).
    async fn delete_all_unused_containers(&self) -> Result<(), BoxError>;

    /// Removes every image no container uses (`DeleteUnusedImages`).
    async fn delete_unused_images(&self) -> Result<(), BoxError>;
}

/// Why a pass runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The 10 s timer.
    Periodic,
    /// A kernel pressure signal from `source`, seen at `at`.
    Signal {
        /// `psi`, `memcg`, `ebpf_reclaim`, ... (the metric label).
        source: String,
        /// When the kernel reported it (or when the agent saw it).
        at: Instant,
    },
}

/// An eviction decided by a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// The pod.
    pub pod: Pod,
    /// The signal whose threshold was acted on.
    pub signal: Signal,
    /// The starved resource.
    pub resource: Resource,
    /// A hard threshold (immediate kill) or a soft one.
    pub hard: bool,
    /// The grace period to stop the pod with: 0 for a hard threshold, else
    /// min(`terminationGracePeriodSeconds`, `evictionMaxPodGracePeriod`).
    pub grace_period_seconds: i64,
    /// The status message and event message.
    pub message: String,
    /// The eviction event's annotations (`offending_containers`, ...).
    pub annotations: BTreeMap<String, String>,
    /// The `DisruptionTarget` condition (none for local storage limit evictions, as
    /// upstream).
    pub condition: Option<PodCondition>,
    /// For a local storage limit eviction, which limit (then `signal` is
    /// `nodefs.available`, the filesystem the limits protect, and `resource`
    /// `ephemeral-storage`).
    pub limit: Option<LocalStorageLimit>,
}

impl Eviction {
    /// The status reason: `Evicted`.
    pub const REASON: &'static str = REASON;

    /// Writes the eviction into the pod's status (phase `Failed`, reason, message,
    /// condition with `lastTransitionTime` `now`).
    pub fn apply_to_status(&self, status: &mut PodStatus, now: Time) {
        apply_eviction_status(status, &self.message, self.condition.as_ref(), now);
    }
}

/// Everything the manager is given.
pub struct Dependencies {
    /// Stats.
    pub stats: Arc<dyn StatsSource>,
    /// Pods.
    pub pods: Arc<dyn ActivePods>,
    /// The kill.
    pub killer: Arc<dyn PodKiller>,
    /// Container and image GC.
    pub reclaimer: Arc<dyn NodeReclaimer>,
    /// Events (`EvictionThresholdMet` on the node, `Evicted` on the pod).
    pub recorder: Arc<dyn EventRecorder>,
    /// Metric families.
    pub metrics: EvictionMetrics,
    /// The node's name (for node events).
    pub node_name: String,
    /// Where the agent's records go (the event API's `EVICTION_DECIDED`).
    pub records: crate::event_api::EventBus,
}

impl std::fmt::Debug for Dependencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dependencies").field("node_name", &self.node_name).finish_non_exhaustive()
    }
}

/// State kept between passes.
#[derive(Debug, Default)]
struct State {
    /// The configured thresholds with the `containerfs.*` ones derived, once the image
    /// filesystem layout is known.
    thresholds: Option<(Vec<Threshold>, bool)>,
    node_conditions: Vec<NodeCondition>,
    node_conditions_last_observed_at: ConditionsObservedAt,
    thresholds_first_observed_at: ThresholdsObservedAt,
    thresholds_met: Vec<Threshold>,
    last_observations: Observations,
}

/// The eviction manager. Share it behind an `Arc`: [`Self::run`] drives it, node status
/// reads [`Self::node_conditions`], admission calls [`Self::admit`].
pub struct EvictionManager {
    config: EvictionConfig,
    deps: Dependencies,
    state: Mutex<State>,
}

impl std::fmt::Debug for EvictionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvictionManager").field("config", &self.config).finish_non_exhaustive()
    }
}

impl EvictionManager {
    /// A manager with `config` over `deps`.
    #[must_use]
    pub fn new(config: EvictionConfig, deps: Dependencies) -> Self {
        Self { config, deps, state: Mutex::default() }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &EvictionConfig {
        &self.config
    }

    /// The pressure conditions now true (memory, disk, PID order).
    #[must_use]
    pub fn node_conditions(&self) -> Vec<NodeCondition> {
        self.state.lock().unwrap().node_conditions.clone()
    }

    /// `IsUnderMemoryPressure`.
    #[must_use]
    pub fn is_under_memory_pressure(&self) -> bool {
        self.node_conditions().contains(&NodeCondition::MemoryPressure)
    }

    /// `IsUnderDiskPressure`.
    #[must_use]
    pub fn is_under_disk_pressure(&self) -> bool {
        self.node_conditions().contains(&NodeCondition::DiskPressure)
    }

    /// `IsUnderPIDPressure`.
    #[must_use]
    pub fn is_under_pid_pressure(&self) -> bool {
        self.node_conditions().contains(&NodeCondition::PidPressure)
    }

    /// Admission under pressure (`Admit`).
    ///
    /// # Errors
    /// The refusal (reason `Evicted`, message `The node had condition: [..]. `).
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        admit(&self.node_conditions(), pod)
    }

    /// The thresholds in effect and whether the image filesystem is dedicated; `None`
    /// while the layout is unknown.
    async fn thresholds(&self) -> Option<(Vec<Threshold>, bool)> {
        if let Some(known) = self.state.lock().unwrap().thresholds.clone() {
            return Some(known);
        }
        match self.deps.stats.has_dedicated_image_fs().await {
            Ok(dedicated) => {
                let thresholds = with_container_fs_thresholds(&self.config.thresholds, dedicated);
                let known = (thresholds, dedicated);
                self.state.lock().unwrap().thresholds = Some(known.clone());
                Some(known)
            }
            Err(error) => {
                tracing::error!(%error, "eviction manager: failed to get HasDedicatedImageFs");
                None
            }
        }
    }

    /// One pass (upstream `synchronize`); returns the eviction it decided, if any.
    pub async fn synchronize(&self, trigger: Trigger) -> Option<Eviction> {
        if self.config.thresholds.is_empty() && !self.config.local_storage_capacity_isolation {
            return None;
        }
        let pass_mono_ns = crate::types::clock::monotonic_now_ns();
        let (configured, dedicated_image_fs) = self.thresholds().await?;
        let active = self.deps.pods.active_pods();
        let snapshot = match self.deps.stats.snapshot().await {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(%error, "eviction manager: failed to get summary stats");
                return None;
            }
        };
        let observations = make_observations(&snapshot);
        let now = Instant::now();

        let thresholds = {
            let mut state = self.state.lock().unwrap();
            let mut met = thresholds_met(&configured, &observations, false);
            if !state.thresholds_met.is_empty() {
                let not_yet_resolved = thresholds_met(&state.thresholds_met, &observations, true);
                met = merge_thresholds(met, &not_yet_resolved);
            }
            let first_observed_at = thresholds_first_observed_at(&met, &state.thresholds_first_observed_at, now);
            let current = node_conditions(&met);
            let last_observed_at =
                node_conditions_last_observed_at(&current, &state.node_conditions_last_observed_at, now);
            let conditions =
                node_conditions_observed_since(&last_observed_at, self.config.pressure_transition_period, now);
            if conditions != state.node_conditions {
                tracing::info!(?conditions, "eviction manager: node conditions changed");
            }
            let met_grace = thresholds_met_grace_period(&first_observed_at, now);
            state.node_conditions = conditions;
            state.thresholds_first_observed_at = first_observed_at;
            state.node_conditions_last_observed_at = last_observed_at;
            let updated = thresholds_updated_stats(&met_grace, &observations, &state.last_observations);
            state.thresholds_met = met_grace;
            state.last_observations = observations.clone();
            updated
        };
        if self.config.local_storage_capacity_isolation
            && let Some(eviction) = self.local_storage_eviction(&active, &snapshot, dedicated_image_fs).await
        {
            return Some(eviction);
        }
        if thresholds.is_empty() {
            return None;
        }
        let mut thresholds = thresholds;
        sort_by_eviction_priority(&mut thresholds);
        let threshold = thresholds[0];
        let resource = threshold.signal.resource();
        tracing::info!(%resource, signal = %threshold.signal, "eviction manager: attempting to reclaim");
        self.deps.recorder.record(
            node_ref(&self.deps.node_name),
            EventType::Warning,
            "EvictionThresholdMet",
            format!("Attempting to reclaim {resource}"),
        );
        if self.reclaim_node_level_resources(threshold.signal, &configured, dedicated_image_fs).await {
            tracing::info!(%resource, "eviction manager: able to reduce resource pressure without evicting pods");
            return None;
        }
        tracing::info!(%resource, "eviction manager: must evict pod(s) to reclaim");
        if active.is_empty() {
            tracing::error!("eviction manager: eviction thresholds have been met, but no pods are active to evict");
            return None;
        }
        // Disk signals rank by usages measured now (see `snapshot_with_fresh_disk_usage`).
        // Only when some pod can be evicted: a node full of critical pods walks nothing.
        let snapshot = if threshold.signal.node_condition() == NodeCondition::DiskPressure
            && active.iter().any(|p| !is_critical_pod(p))
        {
            match self.deps.stats.snapshot_with_fresh_disk_usage().await {
                Ok(fresh) => fresh,
                Err(error) => {
                    tracing::warn!(%error, "eviction manager: cannot refresh disk usage; ranking by the last measurements");
                    snapshot
                }
            }
        } else {
            snapshot
        };
        let usage = snapshot.pods_by_uid();
        let ranked = rank(&active, &usage, Ranking::for_signal(threshold.signal, dedicated_image_fs));
        tracing::info!(pods = ?ranked.iter().map(|p| p.metadata.name.as_deref().unwrap_or_default()).collect::<Vec<_>>(), "eviction manager: pods ranked for eviction");
        for t in &thresholds {
            if let Some(time) = observations.get(&t.signal).and_then(|o| o.time) {
                let age = SystemTime::now().duration_since(time).unwrap_or_default();
                let labels = SignalLabels { eviction_signal: t.signal.as_str().to_owned() };
                self.deps.metrics.stats_age.get_or_create(&labels).observe(age.as_secs_f64());
            }
        }
        for pod in ranked {
            if is_critical_pod(pod) {
                tracing::error!(pod = ?pod.metadata.name, "eviction manager: cannot evict a critical pod");
                continue;
            }
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let (message, annotations) =
                eviction_message(resource, pod, usage.get(uid).copied(), &thresholds, &observations);
            let grace_period_seconds = if threshold.is_hard() {
                0
            } else {
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
                own.min(self.config.max_pod_grace_period_seconds)
            };
            let eviction = Eviction {
                pod: Pod::clone(pod),
                signal: threshold.signal,
                resource,
                hard: threshold.is_hard(),
                grace_period_seconds,
                condition: Some(disruption_target_condition(&message)),
                message,
                annotations,
                limit: None,
            };
            // The event API's record for `cargo xtask bench eviction`: when the pass that
            // decided started, when its kernel signal came (0 for the periodic pass) and
            // when it decided.
            let decided_mono_ns = crate::types::clock::monotonic_now_ns();
            let (trigger_name, signal_mono_ns) = match &trigger {
                Trigger::Periodic => ("periodic", 0),
                Trigger::Signal { source, at } => (
                    source.as_str(),
                    decided_mono_ns.saturating_sub(u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX)),
                ),
            };
            self.deps.records.publish(crate::event_api::NodeEvent {
                pod_uid: uid.to_owned(),
                agent_time_ns: Some(decided_mono_ns),
                eviction: Some(crate::event_api::EvictionRecord {
                    eviction_signal: threshold.signal.as_str().to_owned(),
                    trigger: trigger_name.to_owned(),
                    pass_time_ns: pass_mono_ns,
                    signal_time_ns: signal_mono_ns,
                }),
                ..crate::event_api::NodeEvent::for_pod(crate::event_api::NodeEventKind::EvictionDecided, pod)
            });
            if let Trigger::Signal { source, at } = &trigger {
                let labels = SourceLabels { source: source.clone() };
                self.deps.metrics.signal_to_decision.get_or_create(&labels).observe(at.elapsed().as_secs_f64());
            }
            self.deps.recorder.record(pod_ref(pod), EventType::Warning, REASON, eviction.message.clone());
            match self.deps.killer.kill_pod(&eviction).await {
                Ok(()) => tracing::info!(pod = ?pod.metadata.name, "eviction manager: pod is evicted successfully"),
                Err(error) => {
                    tracing::error!(pod = ?pod.metadata.name, %error, "eviction manager: pod failed to evict");
                }
            }
            let labels = SignalLabels { eviction_signal: threshold.signal.as_str().to_owned() };
            self.deps.metrics.evictions.get_or_create(&labels).inc();
            return Some(eviction);
        }
        tracing::info!("eviction manager: unable to evict any pods from the node");
        None
    }

    /// `localStorageEviction`: evicts, at once, every active pod over one of its local
    /// storage limits ([`super::local_storage`]); returns the first of them.
    async fn local_storage_eviction(
        &self,
        active: &[Arc<Pod>],
        snapshot: &NodeSnapshot,
        dedicated_image_fs: bool,
    ) -> Option<Eviction> {
        let usage = snapshot.pods_by_uid();
        let mut first = None;
        for pod in active {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let Some(violation) = usage.get(uid).and_then(|u| local_storage::violation(pod, u, dedicated_image_fs))
            else {
                continue;
            };
            if is_critical_pod(pod) {
                tracing::error!(pod = ?pod.metadata.name, "eviction manager: cannot evict a critical pod");
                continue;
            }
            let eviction = Eviction {
                pod: Pod::clone(pod),
                signal: Signal::NodeFsAvailable,
                resource: Resource::EphemeralStorage,
                hard: true,
                grace_period_seconds: 0,
                message: violation.message,
                annotations: BTreeMap::new(),
                condition: None,
                limit: Some(violation.limit),
            };
            tracing::info!(pod = ?pod.metadata.name, limit = violation.limit.metric_label(), "eviction manager: pod over its local storage limit");
            self.deps.recorder.record(pod_ref(pod), EventType::Warning, REASON, eviction.message.clone());
            match self.deps.killer.kill_pod(&eviction).await {
                Ok(()) => tracing::info!(pod = ?pod.metadata.name, "eviction manager: pod is evicted successfully"),
                Err(error) => {
                    tracing::error!(pod = ?pod.metadata.name, %error, "eviction manager: pod failed to evict");
                }
            }
            let labels = SignalLabels { eviction_signal: violation.limit.metric_label().to_owned() };
            self.deps.metrics.evictions.get_or_create(&labels).inc();
            first.get_or_insert(eviction);
        }
        first
    }

    /// `reclaimNodeLevelResources`: runs the signal's reclaim functions; true when fresh
    /// stats then show no threshold met, minimum reclaim included.
    async fn reclaim_node_level_resources(
        &self,
        signal: Signal,
        thresholds: &[Threshold],
        dedicated_image_fs: bool,
    ) -> bool {
        let functions = node_reclaim_functions(signal, dedicated_image_fs);
        if functions.is_empty() {
            return false;
        }
        for function in functions {
            let result = match function {
                ReclaimFunction::DeleteAllUnusedContainers => self.deps.reclaimer.delete_all_unused_containers().await,
                ReclaimFunction::DeleteUnusedImages => self.deps.reclaimer.delete_unused_images().await,
            };
            if let Err(error) = result {
                tracing::info!(%error, ?function, "eviction manager: unexpected error when attempting to reduce resource pressure");
            }
        }
        let snapshot = match self.deps.stats.snapshot().await {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(%error, "eviction manager: failed to get summary stats after resource reclaim");
                return false;
            }
        };
        thresholds_met(thresholds, &make_observations(&snapshot), true).is_empty()
    }

    /// Waits for an evicted pod's cleanup, at most [`POD_CLEANUP_TIMEOUT`].
    async fn wait_for_pod_cleanup(&self, pod: &Pod, shutdown: &CancellationToken) {
        let deadline = tokio::time::sleep(POD_CLEANUP_TIMEOUT);
        tokio::pin!(deadline);
        let mut poll = tokio::time::interval_at(Instant::now() + POD_CLEANUP_POLL, POD_CLEANUP_POLL);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut deadline => {
                    tracing::info!(pod = ?pod.metadata.name, "eviction manager: timed out waiting for pods to be cleaned up");
                    return;
                }
                _ = poll.tick() => {
                    if self.deps.pods.pod_cleaned_up(pod) {
                        tracing::info!(pod = ?pod.metadata.name, "eviction manager: pods successfully cleaned up");
                        return;
                    }
                }
            }
        }
    }

    /// The manager's loop (see the module docs) until `shutdown`. The first pass runs at
    /// once.
    pub async fn run(self: Arc<Self>, mut signals: mpsc::Receiver<PressureSignal>, shutdown: CancellationToken) {
        let mut next = Instant::now();
        let mut signals_open = true;
        loop {
            let trigger = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                signal = signals.recv(), if signals_open => {
                    let Some(mut first) = signal else {
                        signals_open = false;
                        continue;
                    };
                    while let Ok(more) = signals.try_recv() {
                        if more.at < first.at {
                            first = more;
                        }
                    }
                    Trigger::Signal { source: first.source.label().to_owned(), at: first.at }
                }
                () = tokio::time::sleep_until(next) => Trigger::Periodic,
            };
            match self.synchronize(trigger).await {
                Some(eviction) => {
                    tracing::info!(pod = ?eviction.pod.metadata.name, "eviction manager: pods evicted, waiting for pod to be cleaned up");
                    self.wait_for_pod_cleanup(&eviction.pod, &shutdown).await;
                    while signals.try_recv().is_ok() {}
                    next = Instant::now();
                }
                None => next = Instant::now() + MONITORING_INTERVAL,
            }
        }
    }
}
