//! The kubelet's main loop (`syncLoop` / `syncLoopIteration`): fans in pod source
//! updates, PLEG events and the housekeeping timer, and dispatches work to the pod
//! workers. It never blocks on a pod: everything slow happens in the workers.
//!
//! Housekeeping (upstream `HandlePodCleanups`) decides on the loop what needs the pod
//! set (orphaned runtime pods to kill, metrics, probe workers), and hands the file
//! system work — orphaned pod cgroups, pod directories and log directories — to one
//! pass on the blocking pool. Upstream runs housekeeping on its loop, so no pod is
//! admitted while it runs; here the loop goes on, so:
//! - at most one pass runs at a time: a tick that finds the previous pass still at work
//!   skips housekeeping altogether;
//! - the pass decides on each item right before removing it, against the live pod set,
//!   and holds a [`CleanupClaim`] on its UID while it removes it: a pod admitted while
//!   the pass runs is spared, or (same UID) its worker waits for the removal to end
//!   before it creates anything.

pub mod metrics;
mod resize;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cm::PodContainerManager;
use crate::container::cache::RuntimeCache;
use crate::metrics::StaticLabels;
use crate::pleg::{PodLifecycleEvent, PodLifecycleEventType};
use crate::pod_manager::PodManager;
use crate::pod_workers::{CleanupClaim, PodWorkers, WorkType};
use crate::runtime::RuntimeManager;
use crate::sources::PodUpdate;
use metrics::{SyncLoopMetrics, WorkingPodLabels};

/// Upstream `housekeepingPeriod`.
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

/// How often freed heap memory is handed back to the kernel. A 100-pod burst takes the
/// heap to nearly twice its size at rest (heaptrack: 26 against 15 MiB live); trimmed
/// every minute, the RSS stayed 10–15 MiB above its resting value for up to a minute
/// after the burst, every 10 s it is back within seconds, for no measurable idle CPU.
pub const MEMORY_TRIM_PERIOD: Duration = Duration::from_secs(10);

/// A pod the API server marked for deletion is terminated with its deletion grace
/// period (upstream: `deletionGracePeriodSeconds`), else `kind`.
fn deletion_or(pod: &k8s_openapi::api::core::v1::Pod, kind: WorkType) -> WorkType {
    if pod.metadata.deletion_timestamp.is_some() {
        WorkType::Kill { grace: pod.metadata.deletion_grace_period_seconds }
    } else {
        kind
    }
}

/// The loop's collaborators.
#[derive(Debug)]
pub struct SyncLoop {
    pub pod_manager: PodManager,
    pub workers: PodWorkers,
    /// The runtime cache the PLEG writes: housekeeping reads its listing.
    pub cache: Arc<RuntimeCache>,
    pub runtime: Arc<RuntimeManager>,
    pub cm: Arc<dyn PodContainerManager>,
    /// The housekeeping counts (`kubelet_desired_pods`, ...).
    pub metrics: Arc<SyncLoopMetrics>,
    /// The PLEG's families: the loop observes `kubelet_evented_pleg_event_latency_seconds`
    /// when a kernel event reaches its pod worker.
    pub pleg_metrics: Arc<crate::pleg::metrics::PlegMetrics>,
    /// The node as registered (API mode): admission checks pods against it.
    pub node: Option<Arc<std::sync::RwLock<Option<k8s_openapi::api::core::v1::Node>>>>,
    pub status: Arc<dyn crate::status::StatusProvider>,
    pub recorder: Arc<dyn crate::events::EventRecorder>,
    /// Pods refused by admission (they never get a worker).
    pub rejected: std::sync::Mutex<HashSet<String>>,
    /// The eviction manager (none without stats): under node pressure it refuses pods too.
    pub eviction: Option<Arc<crate::eviction::EvictionManager>>,
    /// Admission checks between the eviction check and the node-fit predicates (topology
    /// manager, node shutdown).
    pub admit_handlers: Vec<Arc<dyn crate::lifecycle::admission::PodAdmitHandler>>,
    /// Adjusts the node before the node-fit predicates (the device manager's).
    pub update_plugin_resources: Option<Arc<dyn crate::lifecycle::admission::PluginResourceUpdater>>,
    /// The agent's tasks: housekeeping passes and cgroup updates run under it.
    pub tracker: tokio_util::task::TaskTracker,
    /// The housekeeping pass on the blocking pool, if one was started.
    pub housekeeping_pass: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The file system half of housekeeping, run on the blocking pool (see the module
/// docs): what it removes, it decides on at the last moment.
struct CleanupPass {
    cm: Arc<dyn PodContainerManager>,
    runtime: Arc<RuntimeManager>,
    metrics: Arc<SyncLoopMetrics>,
    pods: PodManager,
    workers: PodWorkers,
    /// Pods the runtime still has (as of the PLEG's last listing): their directories
    /// and cgroups are container GC's and their worker's business.
    runtime_pods: HashSet<String>,
}

impl CleanupPass {
    /// The right to remove what `uid` left: none while the pod is desired, the runtime
    /// has it or a worker runs for it.
    fn claim(&self, uid: &str) -> Option<CleanupClaim> {
        if self.runtime_pods.contains(uid) || self.pods.contains(uid) {
            return None;
        }
        let claim = self.workers.claim_for_cleanup(uid)?;
        // Added between the check above and the claim: its worker waits on the claim,
        // but nothing of a desired pod is an orphan.
        (!self.pods.contains(uid)).then_some(claim)
    }

    fn run(&self) {
        match self.cm.list_pod_cgroups() {
            Ok(cgroups) => {
                for (uid, _) in cgroups {
                    let Some(_claim) = self.claim(&uid) else { continue };
                    tracing::info!(%uid, "removing orphaned pod cgroup");
                    if let Err(e) = self.cm.remove_pod_cgroup(&uid) {
                        tracing::warn!(%uid, error = %e, "failed to remove orphaned pod cgroup");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list pod cgroups"),
        }
        self.runtime.cleanup_orphaned_log_dirs(|uid| self.claim(uid));
        self.runtime.userns().cleanup_orphans(|uid| self.runtime_pods.contains(uid) || self.pods.contains(uid));
        match self.runtime.volumes().cleanup_orphans(|uid| self.claim(uid)) {
            Ok(sweep) => {
                self.metrics.orphan_pod_cleaned_volumes.set(sweep.removed.len() as i64);
                self.metrics.orphan_pod_cleaned_volumes_errors.set(sweep.failed.len() as i64);
            }
            Err(e) => tracing::warn!(error = %e, "failed to clean up orphaned pod volumes"),
        }
        // CSI volumes staged for pods that are gone (removed while the agent was down).
        let volumes = self.runtime.volumes();
        for e in volumes.csi().unstage_unused(volumes.root_dir()) {
            tracing::warn!(error = %e, "failed to unstage an unused CSI volume");
        }
    }
}

impl SyncLoop {
    /// Applies one source snapshot: removals first, so that an edited static pod's old
    /// instance is already terminating when the new one arrives.
    pub fn handle_update(&self, update: PodUpdate) {
        let changes = self.pod_manager.apply(update);
        let any_change = !(changes.added.is_empty() && changes.removed.is_empty() && changes.updated.is_empty());
        for pod in changes.removed {
            tracing::info!(pod = %crate::types::pod::pod_full_name(&pod), "pod removed from its source");
            if let Some(uid) = &pod.metadata.uid
                && self.rejected.lock().unwrap().remove(uid)
            {
                self.status.remove(uid);
                continue;
            }
            self.resize_pod_removed(&pod);
            if pod.metadata.uid.as_deref().is_some_and(|uid| self.workers.forget_finished(uid)) {
                continue;
            }
            self.workers.update_pod(pod, WorkType::Kill { grace: None });
        }
        // Oldest first, each admitted against the pods admitted before it (upstream
        // `HandlePodAdditions`); the active pods are gathered once for the whole update,
        // not once per pod.
        let mut added = changes.added;
        added.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
        let mut active: Option<Vec<k8s_openapi::api::core::v1::Pod>> = None;
        for pod in added {
            tracing::info!(pod = %crate::types::pod::pod_full_name(&pod), "pod added");
            let startup = self.runtime.startup_tracker();
            startup.begin_trace(&pod);
            if pod.metadata.deletion_timestamp.is_none() {
                let span = crate::telemetry::pod_step_span("admitPod", "", "");
                let root = startup.trace_root(pod.metadata.uid.as_deref().unwrap_or_default());
                if let Some(root) = &root {
                    crate::telemetry::set_trace_parent(&span, root);
                }
                let active = active.get_or_insert_with(|| self.active_pods());
                // (A pod added again under its UID while its worker terminates it is not
                // its own neighbour.)
                active.retain(|p| p.metadata.uid != pod.metadata.uid);
                if span.in_scope(|| self.admit(&pod, active)) {
                    active.push(pod.clone());
                } else {
                    crate::telemetry::record_error(&span, "rejected by admission");
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        startup.end_trace(uid, crate::pod_startup::StartOutcome::Rejected);
                    }
                    continue;
                }
            }
            self.resize_pod_added(&pod);
            let kind = deletion_or(&pod, WorkType::Create);
            self.workers.update_pod(pod, kind);
        }
        for pod in changes.updated {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if self.rejected.lock().unwrap().contains(&uid) {
                continue;
            }
            self.resize_pod_updated(&pod);
            let kind = deletion_or(&pod, WorkType::Update);
            self.workers.update_pod(pod, kind);
        }
        // A readiness gate's condition changed (another component set it): the pod's
        // Ready condition follows at a sync.
        for pod in changes.reconcile {
            self.workers.update_pod(pod, WorkType::Sync);
        }
        self.pod_manager.mark_handled();
        self.update_pod_count_metrics();
        if any_change {
            self.update_qos_cgroups();
        }
    }

    /// A PLEG event: sync the pod it concerns (removals need no sync, as upstream).
    pub fn handle_pleg_event(&self, ev: &PodLifecycleEvent) {
        // Before the worker hears of it: a status read before the change is stale now. The
        // change happened when the kernel saw it (a CLOCK_MONOTONIC time, the clock of
        // tokio's instants), or for a relist event at the latest now.
        let now = tokio::time::Instant::now();
        let at = ev.kernel_time_ns.map_or(now, |k| {
            now.checked_sub(Duration::from_nanos(crate::types::clock::monotonic_now_ns().saturating_sub(k)))
                .unwrap_or(now)
        });
        // An exit the kernel saw and the PLEG recorded is carried by every status the
        // cache hands out: the kept status, stale for the sync's actions, stays at hand
        // for the exit's early status write (see `RuntimeCache`).
        let kernel_exit = ev.kind == PodLifecycleEventType::ContainerDied
            && ev.kernel_time_ns.is_some()
            && self.cache.exits().get(&ev.data).is_some()
            && !self.cache.exits().awaits_runtime(&ev.data);
        if kernel_exit {
            self.cache.exit_recorded(&ev.pod_uid, at);
        } else {
            self.cache.invalidate(&ev.pod_uid, at);
        }
        self.cache.containers_changed();
        if ev.kind == PodLifecycleEventType::ContainerRemoved {
            return;
        }
        if let Some(pod) = self.pod_manager.get(&ev.pod_uid) {
            tracing::debug!(uid = %ev.pod_uid, kind = ?ev.kind, id = %ev.data, "PLEG event");
            // The event API's record of when the event reached the pod worker (what
            // `cargo xtask bench pleg` times the PLEG by), made before the pod moves to
            // its worker and only when a watcher asked for records.
            let records = self.workers.records();
            let record = (records.subscriber_count() > 0).then(|| crate::event_api::NodeEvent {
                container_id: ev.data.clone(),
                kernel_time_ns: ev.kernel_time_ns,
                pleg_event: format!("{:?}", ev.kind),
                ..crate::event_api::NodeEvent::for_pod(crate::event_api::NodeEventKind::PlegEventDispatched, &pod)
            });
            if ev.kind == PodLifecycleEventType::ContainerStarted {
                self.workers.container_started(pod, ev.data.clone());
            } else {
                self.workers.update_pod(pod, WorkType::Sync);
            }
            if let Some(record) = record {
                records.publish(crate::event_api::NodeEvent {
                    agent_time_ns: Some(crate::types::clock::monotonic_now_ns()),
                    ..record
                });
            }
            if let Some(k) = ev.kernel_time_ns {
                let now = crate::types::clock::monotonic_now_ns();
                self.pleg_metrics.evented_pleg_event_latency.observe(now.saturating_sub(k) as f64 / 1e9);
            }
        }
    }

    /// The admitted pods that still run (upstream `GetActivePods`): those with a worker
    /// that have not reached a terminal phase. Pods of the update being handled are not
    /// among them until admitted.
    fn active_pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        let rejected = self.rejected.lock().unwrap();
        let workers = self.workers.known_uids();
        self.pod_manager
            .pods()
            .into_iter()
            .filter(|p| {
                let u = p.metadata.uid.as_deref().unwrap_or_default();
                workers.contains(u)
                    && !rejected.contains(u)
                    && !matches!(self.status.phase(u).as_deref(), Some("Succeeded" | "Failed"))
            })
            .map(Arc::unwrap_or_clone)
            .collect()
    }

    /// Node admission (API mode, once the node is registered) next to the `active`
    /// pods: a refused pod gets a `Failed` status with the kubelet's reason and message
    /// and never runs.
    fn admit(&self, pod: &k8s_openapi::api::core::v1::Pod, active: &[k8s_openapi::api::core::v1::Pod]) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // Node pressure first (upstream's eviction admit handler), API mode or not.
        if let Some(Err(r)) = self.eviction.as_ref().map(|m| m.admit(pod)) {
            return self.reject(pod, &uid, r);
        }
        // The admit handlers (topology manager: CPU, memory and device allocation) run
        // before the node-fit predicates, as upstream registers them: a pod asking for
        // more devices than are free is refused by the device manager.
        for h in &self.admit_handlers {
            if let Err(r) = h.admit(pod, active) {
                return self.reject(pod, &uid, r);
            }
        }
        if let Some(mut node) = self.node.as_ref().and_then(|n| n.read().unwrap().clone()) {
            if let Some(update) = &self.update_plugin_resources {
                update.update_plugin_resources(&mut node);
            }
            if let Err(r) = crate::lifecycle::admission::admit(pod, &node, active) {
                return self.reject(pod, &uid, r);
            }
        }
        true
    }

    /// Refuses `pod`: a `Failed` status with the kubelet's reason and message, an event.
    fn reject(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        uid: &str,
        r: crate::lifecycle::admission::Rejection,
    ) -> bool {
        {
            {
                tracing::warn!(pod = %crate::types::pod::pod_full_name(pod), reason = %r.reason, message = %r.message, "pod rejected");
                self.recorder.record(
                    crate::events::pod_ref(pod),
                    crate::events::EventType::Warning,
                    &r.reason,
                    r.message.clone(),
                );
                self.status.set(
                    uid,
                    k8s_openapi::api::core::v1::PodStatus {
                        phase: Some("Failed".into()),
                        reason: Some(r.reason),
                        message: Some(format!("Pod was rejected: {}", r.message)),
                        // Upstream's status manager gives every status it sets a start
                        // time, a rejected pod's too.
                        start_time: Some(crate::status::generate::time(std::time::SystemTime::now())),
                        ..Default::default()
                    },
                );
                self.rejected.lock().unwrap().insert(uid.to_owned());
                false
            }
        }
    }

    /// Re-derives the `QoS` cgroups' settings (burstable cpu shares) from the active pods,
    /// off the loop: cgroup writes block.
    fn update_qos_cgroups(&self) {
        let cm = self.cm.clone();
        // At their allocated resources (a resize counts once admitted).
        let pods: Vec<_> = self
            .pod_manager
            .pods()
            .into_iter()
            .map(|p| self.runtime.allocation().update_pod_from_allocation(&p).0)
            .collect();
        self.tracker.spawn_blocking(move || {
            if let Err(e) = cm.update_qos_cgroups(&pods) {
                tracing::warn!(error = %e, "failed to update QoS cgroups");
            }
        });
    }

    fn update_pod_count_metrics(&self) {
        let (total, n_static) = self.pod_manager.counts();
        for (label, n) in [("true", n_static as i64), ("false", (total - n_static) as i64)] {
            let l = StaticLabels { r#static: label.into() };
            self.metrics.desired_pods.get_or_create(&l).set(n);
            self.metrics.active_pods.get_or_create(&l).set(n);
        }
        let ephemeral = self.pod_manager.ephemeral_containers();
        self.metrics.managed_ephemeral_containers.set(i64::try_from(ephemeral).unwrap_or(i64::MAX));
    }

    /// `kubelet_working_pods` (upstream `HandlePodCleanups`): the pods with a worker by
    /// lifecycle (`sync`, `terminating`, `terminated`) and whether they are still desired
    /// (`desired`) or not (`orphan`), plus pods only the runtime has (`runtime_only`,
    /// `static="unknown"`). Every combination is set, zero included.
    fn update_working_pods(
        &self,
        desired: &HashSet<String>,
        runtime_pods: &std::collections::BTreeMap<String, impl Sized>,
    ) {
        use crate::pod_workers::WorkerState;
        let mut counts: std::collections::HashMap<(&str, &str, &str), i64> = std::collections::HashMap::new();
        for lifecycle in ["sync", "terminating", "terminated"] {
            for config in ["desired", "orphan"] {
                for r#static in ["true", "false"] {
                    counts.insert((lifecycle, config, r#static), 0);
                }
            }
            counts.insert((lifecycle, "runtime_only", "unknown"), 0);
        }
        let states = self.workers.states();
        for (uid, state) in &states {
            let lifecycle = match state {
                WorkerState::Syncing => "sync",
                WorkerState::Terminating => "terminating",
                WorkerState::Terminated | WorkerState::Finished => "terminated",
            };
            let config = if desired.contains(uid) { "desired" } else { "orphan" };
            let is_static = self.pod_manager.is_static(uid);
            *counts.entry((lifecycle, config, if is_static { "true" } else { "false" })).or_default() += 1;
        }
        let runtime_only = runtime_pods.keys().filter(|u| !states.contains_key(*u) && !desired.contains(*u)).count();
        *counts.entry(("sync", "runtime_only", "unknown")).or_default() += runtime_only as i64;
        for ((lifecycle, config, r#static), n) in counts {
            self.metrics
                .working_pods
                .get_or_create(&WorkingPodLabels {
                    lifecycle: lifecycle.into(),
                    config: config.into(),
                    r#static: r#static.into(),
                })
                .set(n);
        }
    }

    /// Upstream `HandlePodCleanups`: terminate runtime pods nobody wants, remove orphaned
    /// pod cgroups, pod and log directories (one pass at a time, off the loop: see the
    /// module docs). Does nothing until every source has reported once and the PLEG has
    /// listed the runtime, so a restart never kills what it should adopt.
    pub fn housekeeping(&self) {
        if !self.pod_manager.sources_ready() || !self.cache.has_listed() {
            return;
        }
        let mut pass = self.housekeeping_pass.lock().unwrap();
        if pass.as_ref().is_some_and(|p| !p.is_finished()) {
            tracing::debug!("the previous housekeeping pass is still running; skipping this one");
            return;
        }
        let desired = self.pod_manager.uids();
        // Finished pods whose removal came before their worker ended (upstream
        // `SyncKnownPods`).
        self.workers.retain_finished(|uid| desired.contains(uid));
        let workers = self.workers.known_uids();
        let runtime_pods = self.cache.runtime_pods();
        self.update_working_pods(&desired, &runtime_pods);
        self.resize_housekeeping(&desired);
        // Only what still runs (upstream lists the runtime's running pods here: a ready
        // sandbox or a running container); what has stopped is container GC's.
        for (uid, rp) in &runtime_pods {
            let running = rp.sandboxes.values().any(|ready| *ready)
                || rp
                    .containers
                    .values()
                    .any(|(_, state)| *state == crate::container::pod_status::ContainerState::Running);
            if running && !desired.contains(uid) && !workers.contains(uid) {
                self.workers.kill_orphan(rp);
            }
        }
        let cleanup = CleanupPass {
            cm: self.cm.clone(),
            runtime: self.runtime.clone(),
            metrics: self.metrics.clone(),
            pods: self.pod_manager.clone(),
            workers: self.workers.clone(),
            runtime_pods: runtime_pods.keys().cloned().collect(),
        };
        *pass = Some(self.tracker.spawn_blocking(move || cleanup.run()));
        drop(pass);
        self.runtime.gc_backoff();
        // Probe workers of pods that are neither wanted nor still being torn down.
        let keep: HashSet<String> = desired.iter().chain(workers.iter()).cloned().collect();
        self.runtime.probes().cleanup_pods(&keep);
        self.update_pod_count_metrics();
    }

    /// A probe result changed: sync the pod (a failed liveness or startup probe kills
    /// and restarts the container there; readiness and `started` reach the status).
    pub fn handle_probe_update(&self, u: &crate::prober::ProbeUpdate) {
        if let Some(pod) = self.pod_manager.get(&u.pod_uid) {
            tracing::debug!(uid = %u.pod_uid, container = %u.container_name, probe = %u.probe_type, result = ?u.result, "probe result changed");
            self.workers.update_pod(pod, WorkType::Sync);
        }
    }

    /// Syncs the pods whose devices changed health, so that their containers'
    /// `allocatedResourcesStatus` says so (upstream's `containerManager.Updates()` case;
    /// pods this node no longer has are skipped).
    pub fn handle_health_update(&self, uids: &[String]) {
        for uid in uids {
            if let Some(pod) = self.pod_manager.get(uid) {
                tracing::debug!(%uid, "device health changed");
                self.workers.update_pod(pod, WorkType::Sync);
            }
        }
    }

    /// Runs until shutdown.
    pub async fn run(
        self,
        mut updates: mpsc::Receiver<PodUpdate>,
        mut pleg_events: mpsc::Receiver<PodLifecycleEvent>,
        probe_updates: Option<mpsc::UnboundedReceiver<crate::prober::ProbeUpdate>>,
        health_updates: Option<mpsc::UnboundedReceiver<Vec<String>>>,
        shutdown: CancellationToken,
    ) {
        let mut probe_updates = probe_updates;
        let mut health_updates = health_updates;
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Freed heap back to the kernel now and then (see `crate::memory`).
        let mut trim = tokio::time::interval(MEMORY_TRIM_PERIOD);
        trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                Some(u) = updates.recv() => self.handle_update(u),
                Some(ev) = pleg_events.recv() => self.handle_pleg_event(&ev),
                Some(u) = async { match probe_updates.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                } } => self.handle_probe_update(&u),
                Some(uids) = async { match health_updates.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                } } => self.handle_health_update(&uids),
                _ = housekeeping.tick() => self.housekeeping(),
                _ = trim.tick() => {
                    self.tracker.spawn_blocking(crate::memory::trim);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex};

    use k8s_openapi::api::core::v1::Pod;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::cm::FakePodContainerManager;
    use crate::cm::fake::FakeCall;
    use crate::container::RuntimeService;
    use crate::container::fake::FakeRuntime;
    use crate::events::MemoryRecorder;
    use crate::pod_workers::SyncDeps;
    use crate::status::StatusManager;
    use crate::types::pod::FILE_SOURCE;
    use crate::types::qos::QosClass;

    /// The fake cgroup manager, whose `list_pod_cgroups` waits until the test opens it:
    /// a housekeeping pass held at its start.
    #[derive(Debug, Default)]
    struct HeldCm {
        inner: FakePodContainerManager,
        open: Mutex<bool>,
        opened: Condvar,
        entered: AtomicUsize,
    }

    impl HeldCm {
        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    impl PodContainerManager for HeldCm {
        fn ensure_node_cgroups(&self) -> crate::cm::Result<()> {
            self.inner.ensure_node_cgroups()
        }
        fn cgroup_parent(&self, pod: &Pod) -> String {
            self.inner.cgroup_parent(pod)
        }
        fn ensure_pod_cgroup(&self, pod: &Pod) -> crate::cm::Result<()> {
            self.inner.ensure_pod_cgroup(pod)
        }
        fn remove_pod_cgroup(&self, uid: &str) -> crate::cm::Result<()> {
            self.inner.remove_pod_cgroup(uid)
        }
        fn list_pod_cgroups(&self) -> crate::cm::Result<Vec<(String, QosClass)>> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
            drop(open);
            self.inner.list_pod_cgroups()
        }
        fn pod_cgroup_exists(&self, uid: &str) -> bool {
            self.inner.pod_cgroup_exists(uid)
        }
        fn update_qos_cgroups(&self, active_pods: &[Pod]) -> crate::cm::Result<()> {
            self.inner.update_qos_cgroups(active_pods)
        }
    }

    struct Env {
        dir: tempfile::TempDir,
        cm: Arc<HeldCm>,
        sync_loop: SyncLoop,
        stop: CancellationToken,
    }

    impl Drop for Env {
        /// A failed test must not leave a pass held: the runtime waits for it.
        fn drop(&mut self) {
            self.cm.open();
            self.stop.cancel();
        }
    }

    impl Env {
        fn logs(&self) -> PathBuf {
            self.dir.path().join("logs")
        }

        fn pods(&self) -> PathBuf {
            self.dir.path().join("root").join("pods")
        }

        /// What a pod `uid` leaves behind: its cgroup, pod directory and log directory.
        fn leftovers(&self, uid: &str) -> (PathBuf, PathBuf) {
            self.cm.inner.insert_pod_cgroup(uid, QosClass::BestEffort);
            let (pod_dir, log_dir) = (self.pods().join(uid), self.logs().join(format!("default_p_{uid}")));
            std::fs::create_dir_all(&pod_dir).unwrap();
            std::fs::create_dir_all(&log_dir).unwrap();
            (pod_dir, log_dir)
        }

        fn cgroup_calls(&self, f: impl Fn(&FakeCall) -> bool) -> usize {
            self.cm.inner.calls().iter().filter(|c| f(c)).count()
        }
    }

    fn static_pod(uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": uid,
                         "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": {"restartPolicy": "Always", "hostNetwork": true,
                     "containers": [{"name": "c", "image": "img", "imagePullPolicy": "IfNotPresent",
                                     "terminationMessagePath": ""}]}
        }))
        .unwrap()
    }

    /// A sync loop whose sources are ready and whose PLEG has listed the (empty) runtime.
    async fn env() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let rt = Arc::new(FakeRuntime::with_images(&["img"]));
        let cm = Arc::new(HeldCm::default());
        let mut deps = crate::runtime::manager::RuntimeManagerDeps::fake(rt.clone(), dir.path());
        deps.cm = cm.clone();
        deps.cfg.node_name = "n".into();
        let pleg_metrics = Arc::new(crate::pleg::metrics::PlegMetrics::default());
        let runtime = Arc::new(RuntimeManager::new(deps));
        let status = Arc::new(StatusManager::default());
        let recorder = Arc::new(MemoryRecorder::new("n"));
        let stop = CancellationToken::new();
        let workers = PodWorkers::new(
            Arc::new(SyncDeps {
                runtime: runtime.clone(),
                cm: cm.clone(),
                status: status.clone(),
                metrics: Arc::default(),
                recorder: recorder.clone(),
                runtime_name: "fake".into(),
                sync_frequency: Duration::from_mins(1),
                host_ip: None,
                runtime_state: None,
                records: crate::event_api::EventBus::default(),
            }),
            TaskTracker::new(),
            stop.clone(),
        );
        let pleg = crate::pleg::relist::GenericPleg::new(
            rt.clone(),
            pleg_metrics.clone(),
            runtime.cache().clone(),
            Duration::from_secs(1),
            Duration::from_mins(3),
        );
        pleg.relist_events().await.unwrap();
        let _: &dyn RuntimeService = rt.as_ref();
        let sync_loop = SyncLoop {
            pod_manager: PodManager::new(&[FILE_SOURCE]),
            workers,
            cache: runtime.cache().clone(),
            runtime,
            cm: cm.clone(),
            metrics: Arc::default(),
            pleg_metrics,
            node: None,
            status,
            recorder,
            rejected: std::sync::Mutex::default(),
            eviction: None,
            admit_handlers: Vec::new(),
            update_plugin_resources: None,
            tracker: TaskTracker::new(),
            housekeeping_pass: std::sync::Mutex::default(),
        };
        sync_loop.handle_update(PodUpdate::set(FILE_SOURCE, []));
        Env { dir, cm, sync_loop, stop }
    }

    async fn wait_for(f: impl Fn() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached");
    }

    fn gone(p: &Path) -> bool {
        !p.exists()
    }

    /// Housekeeping removes orphaned log directories off the loop: while its pass is
    /// held, the loop's call has returned and nothing is removed yet.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn housekeeping_does_no_file_system_work_on_the_loop() {
        let e = env().await;
        let (old_dir, old_logs) = e.leftovers("u-old");
        e.sync_loop.housekeeping();
        wait_for(|| e.cm.entered.load(Ordering::SeqCst) == 1).await;
        assert!(old_logs.exists(), "the log directory was removed on the loop");
        e.cm.open();
        wait_for(|| gone(&old_dir) && gone(&old_logs)).await;
        e.stop.cancel();
    }

    /// A housekeeping tick while the previous pass still runs starts no second pass.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn housekeeping_passes_never_overlap() {
        let e = env().await;
        let (old_dir, _) = e.leftovers("u-old");
        e.sync_loop.housekeeping();
        wait_for(|| e.cm.entered.load(Ordering::SeqCst) == 1).await;
        e.sync_loop.housekeeping();
        e.sync_loop.housekeeping();
        // (A second pass would be on the blocking pool by now.)
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = e.cm.entered.load(Ordering::SeqCst);
        e.cm.open();
        wait_for(|| gone(&old_dir)).await;
        assert_eq!(started, 1, "passes overlapped");
        e.stop.cancel();
    }

    /// A pod admitted while a pass runs keeps its cgroup and directories, though the
    /// pass started before it was known; the orphan beside it goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn housekeeping_spares_a_pod_admitted_while_it_runs() {
        let e = env().await;
        let (old_dir, old_logs) = e.leftovers("u-old");
        e.sync_loop.housekeeping();
        wait_for(|| e.cm.entered.load(Ordering::SeqCst) == 1).await;
        // Admitted now; its worker makes its cgroup and directories.
        let (new_dir, new_logs) = e.leftovers("u-new");
        e.sync_loop.handle_update(PodUpdate::set(FILE_SOURCE, [static_pod("u-new")]));
        e.cm.open();
        wait_for(|| gone(&old_dir) && gone(&old_logs)).await;
        assert_eq!(e.cgroup_calls(|c| *c == FakeCall::RemovePodCgroup("u-old".into())), 1);
        assert_eq!(e.cgroup_calls(|c| *c == FakeCall::RemovePodCgroup("u-new".into())), 0);
        assert!(new_dir.exists() && new_logs.exists(), "the new pod's directories were swept");
        e.stop.cancel();
    }

    /// The node of the admission tests: `cpu` allocatable, 1 GiB, 110 pods.
    fn node_with_cpu(cpu: &str) -> Arc<std::sync::RwLock<Option<k8s_openapi::api::core::v1::Node>>> {
        let node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": cpu, "memory": "1Gi", "pods": "110"}}
        }))
        .unwrap();
        Arc::new(std::sync::RwLock::new(Some(node)))
    }

    /// A static pod named and with the UID `name`, created at `created` (RFC 3339).
    fn named_pod(name: &str, created: &str) -> Pod {
        let mut p = static_pod(name);
        p.metadata.name = Some(name.to_owned());
        p.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created.parse().unwrap()));
        p
    }

    /// Pods that arrive in one update are admitted in order, each against the pods
    /// admitted before it (upstream `HandlePodAdditions`), not against the later pods of
    /// the same update: of two pods that each want 60 % of the node's CPU, the first runs
    /// and the second is refused.
    #[tokio::test]
    async fn pods_of_one_update_are_admitted_in_order() {
        let mut e = env().await;
        e.sync_loop.node = Some(node_with_cpu("1"));
        let wants_600m = |uid: &str, created: &str| {
            let mut p = named_pod(uid, created);
            p.spec.as_mut().unwrap().containers[0].resources = Some(
                serde_json::from_value(serde_json::json!({
                    "requests": {"cpu": "600m"}
                }))
                .unwrap(),
            );
            p
        };
        let pods = vec![wants_600m("first", "2026-01-01T00:00:00Z"), wants_600m("second", "2026-01-01T00:00:01Z")];
        e.sync_loop.handle_update(PodUpdate::set(FILE_SOURCE, pods));
        let reason = |uid: &str| e.sync_loop.status.get(uid).and_then(|s| s.reason);
        assert_eq!(reason("first"), None, "the first pod is admitted");
        assert_eq!(reason("second").as_deref(), Some("OutOfcpu"));
        // As upstream's status manager, the rejected pod's status has a start time
        // (found by `cargo xtask fidelity`, admission-out-of-cpu).
        assert!(e.sync_loop.status.get("second").and_then(|s| s.start_time).is_some());
        assert!(e.sync_loop.workers.known_uids().contains("first"));
    }

    /// A PLEG event that reaches a pod's worker is a `PLEG_EVENT_DISPATCHED` record for a
    /// watcher that asked for records: the pod, the container, the event's type and both
    /// clocks. An event of a pod the agent does not know is no record.
    #[tokio::test]
    async fn a_dispatched_pleg_event_is_a_record_on_the_event_bus() {
        let e = env().await;
        let mut records = e.sync_loop.workers.records().subscribe();
        let pod = named_pod("u-pleg", "2026-01-01T00:00:00Z");
        e.sync_loop.handle_update(PodUpdate::set(FILE_SOURCE, [pod]));
        let event = |uid: &str| PodLifecycleEvent {
            pod_uid: uid.into(),
            kind: PodLifecycleEventType::ContainerDied,
            data: "c-1".into(),
            kernel_time_ns: Some(42),
        };
        e.sync_loop.handle_pleg_event(&event("u-unknown"));
        e.sync_loop.handle_pleg_event(&event("u-pleg"));
        let dispatched = loop {
            let ev = tokio::time::timeout(Duration::from_secs(5), records.recv()).await.unwrap().unwrap();
            if ev.kind == crate::event_api::NodeEventKind::PlegEventDispatched {
                break ev;
            }
        };
        assert_eq!(
            (dispatched.pod_uid.as_str(), dispatched.pod_namespace.as_str(), dispatched.pod_name.as_str()),
            ("u-pleg", "default", "u-pleg")
        );
        assert_eq!((dispatched.container_id.as_str(), dispatched.pleg_event.as_str()), ("c-1", "ContainerDied"));
        assert_eq!(dispatched.kernel_time_ns, Some(42));
        assert!(dispatched.agent_time_ns.is_some_and(|t| t > 42));
        e.stop.cancel();
    }

    /// An exit the kernel saw and the PLEG recorded leaves the pod's kept runtime status
    /// at hand for the exit's early status (the record carries the change), though stale
    /// for a sync's actions; an exit that waits for the runtime (its message may be the
    /// end of its log), or one a relist found, makes it stale for both.
    #[tokio::test]
    async fn only_a_recorded_kernel_exit_keeps_the_kept_status_for_the_early_write() {
        let e = env().await;
        let cache = &e.sync_loop.cache;
        let rt = FakeRuntime::default();
        let died = |uid: &str, id: &str, kernel: bool| PodLifecycleEvent {
            pod_uid: uid.into(),
            kind: PodLifecycleEventType::ContainerDied,
            data: id.into(),
            kernel_time_ns: kernel.then(crate::types::clock::monotonic_now_ns),
        };
        for uid in ["recorded", "awaiting", "relisted", "unrecorded"] {
            cache.pod_status(&rt, uid).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        let now = std::time::SystemTime::now();
        cache.exits().record("recorded", "c-1", 137, now);
        cache.exits().record("awaiting", "c-2", 1, now);
        cache.exits().await_runtime("awaiting", "c-2");
        cache.exits().record("relisted", "c-3", 1, now);
        e.sync_loop.handle_pleg_event(&died("recorded", "c-1", true));
        e.sync_loop.handle_pleg_event(&died("awaiting", "c-2", true));
        e.sync_loop.handle_pleg_event(&died("relisted", "c-3", false));
        e.sync_loop.handle_pleg_event(&died("unrecorded", "c-4", true));
        let long_ago = tokio::time::Instant::now() - Duration::from_secs(1);
        let (early, current): (Vec<bool>, Vec<bool>) = ["recorded", "awaiting", "relisted", "unrecorded"]
            .into_iter()
            .map(|uid| (cache.kept_with_new_exit(uid).is_some(), cache.get_newer_than(uid, long_ago).is_some()))
            .unzip();
        assert_eq!(early, [true, false, false, false]);
        assert_eq!(current, [false; 4], "a sync acts on the runtime's answer");
        e.stop.cancel();
    }

    /// Records, for each pod it admits, the pods it was shown and whether the pod
    /// manager said the sources were handled.
    #[derive(Debug, Default)]
    struct Witness {
        pods: PodManager,
        seen: Mutex<Vec<(String, Vec<String>, bool)>>,
    }

    impl crate::lifecycle::admission::PodAdmitHandler for Witness {
        fn admit(&self, pod: &Pod, active: &[Pod]) -> Result<(), crate::lifecycle::admission::Rejection> {
            let names = active.iter().filter_map(|p| p.metadata.name.clone()).collect();
            self.seen.lock().unwrap().push((
                pod.metadata.name.clone().unwrap_or_default(),
                names,
                self.pods.sources_handled(),
            ));
            Ok(())
        }
    }

    /// After an agent restart the first snapshot brings back every pod: while it is
    /// admitted (oldest first, each next to those admitted before it) the sources do not
    /// count as handled, so that the resource managers keep what the later pods hold
    /// (upstream adds a source to `sourcesReady` after `HandlePodAdditions`). They count
    /// as handled from the next update on.
    #[tokio::test]
    async fn sources_count_as_handled_only_after_their_first_snapshot_is_admitted() {
        let mut e = env().await;
        e.sync_loop.node = Some(node_with_cpu("4"));
        // A freshly started agent: no snapshot seen yet.
        e.sync_loop.pod_manager = PodManager::new(&[FILE_SOURCE]);
        let witness = Arc::new(Witness { pods: e.sync_loop.pod_manager.clone(), ..Witness::default() });
        e.sync_loop.admit_handlers.push(witness.clone());
        let first = vec![named_pod("b", "2026-01-01T00:00:01Z"), named_pod("a", "2026-01-01T00:00:00Z")];
        e.sync_loop.handle_update(PodUpdate::set(FILE_SOURCE, first.clone()));
        let mut second = first;
        second.push(named_pod("c", "2026-01-01T00:00:02Z"));
        e.sync_loop.handle_update(PodUpdate::set(FILE_SOURCE, second));
        let seen = witness.seen.lock().unwrap().clone();
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            seen,
            vec![
                ("a".to_owned(), s(&[]), false),
                ("b".to_owned(), s(&["a"]), false),
                ("c".to_owned(), s(&["a", "b"]), true),
            ]
        );
    }
}
