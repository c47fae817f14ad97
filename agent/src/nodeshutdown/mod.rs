//! Graceful node shutdown (upstream `pkg/kubelet/nodeshutdown`): the agent holds a
//! logind `delay` inhibitor lock for `shutdown`; when logind announces
//! `PrepareForShutdown(true)` it marks the node as shutting down (the `Ready` condition
//! turns `False` with "node is shutting down", new pods are rejected with `NodeShutdown`),
//! terminates the active pods group by group in priority order, each group in parallel
//! with its own grace period, and then releases the lock so that the shutdown goes on.
//!
//! | file | owns | upstream |
//! |---|---|---|
//! | this one | periods by priority, grouping, the kill sequence, [`Manager`], admission | `nodeshutdown_manager*.go` |
//! | [`systemd`] | logind and systemd over the system bus, the logind drop-in | `systemd/inhibit_linux.go` |
//! | [`storage`] | the `graceful_node_shutdown_state` file | `storage.go` |
//! | [`adapters`] | the kill through the pod workers | `killPodNow` |
//!
//! # Behaviour (as upstream)
//! - Off (no D-Bus at all) when `shutdownGracePeriod` is 0 and
//!   `shutdownGracePeriodByPodPriority` is empty, or when the `GracefulNodeShutdown` gate
//!   is off. Without `shutdownGracePeriodByPodPriority` (or with the
//!   `GracefulNodeShutdownBasedOnPodPriority` gate off), `shutdownGracePeriod` and
//!   `shutdownGracePeriodCriticalPods` become two groups: priority 0 gets
//!   `shutdownGracePeriod - shutdownGracePeriodCriticalPods` seconds, priority
//!   2000000000 (system critical) `shutdownGracePeriodCriticalPods`.
//! - Start: connect to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else
//!   `unix:path=/run/dbus/system_bus_socket`), read logind's `InhibitDelayMaxUSec`; when
//!   it is below the sum of the groups' periods, write `99-kubelet.conf` with
//!   `InhibitDelayMaxSec` into logind's drop-in directory, have systemd send `SIGHUP` to
//!   `systemd-logind.service` (`KillUnit`), and read the value again (5 tries, 100 ms
//!   doubling); still too small is an error. Then take the lock and watch the signal.
//! - A failed first start is logged ("Failed to start node shutdown manager: ...") and
//!   the agent runs on without the feature, as the kubelet does (the shutdown manager is
//!   not critical). Once started, a lost bus connection is retried every second.
//! - `PrepareForShutdown(true)`: event `NodeShutdown` on the node, node status synced at
//!   once, state file and `kubelet_graceful_shutdown_start_time_seconds` written, pods
//!   killed (phase `Failed` unless `Succeeded`, reason `Terminated`, message "Pod was
//!   terminated in response to imminent node shutdown.", condition `DisruptionTarget`
//!   `True`/`TerminationByKubelet`), each with `min(group period, the pod's
//!   terminationGracePeriodSeconds)`; the next group starts when every pod of this one
//!   is stopped or the group's period is over. Then the end time is written and the lock
//!   released.
//! - The state file and the metrics are written only with the
//!   `GracefulNodeShutdownBasedOnPodPriority` gate on (its default); at start the metrics
//!   are set from the state file of the last shutdown.
//! - `PrepareForShutdown(false)` (cancelled): the node is no longer shutting down (Ready
//!   and admission come back) and a new lock is taken.
//!
//! # Differences from upstream
//! - `SIGUSR1` does not simulate a shutdown (upstream's test hook).
//! - The logind drop-in directory can be moved with `SWIFTLET_LOGIND_CONF_DIR` (for
//!   tests; default `/etc/systemd/logind.conf.d`).
//! - Pods are not waited on for volume unmounts between groups (upstream waits for
//!   CSI volumes; swiftlet has none): a group ends when its pods' workers are done.
//! - `kubelet_graceful_shutdown_*` are always registered (upstream: only with both gates
//!   on, which is their default).

pub mod adapters;
pub mod metrics;
pub mod storage;
pub mod systemd;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::events::{EventRecorder, EventType, node_ref};
use crate::lifecycle::admission::{PodAdmitHandler, Rejection};
use crate::types::pod::SYSTEM_CRITICAL_PRIORITY;
use metrics::ShutdownMetrics;

pub use systemd::{DbusInhibiter, InhibitLock, Inhibiter};

/// The pod status reason of a pod terminated for the shutdown.
pub const REASON: &str = "Terminated";
/// Its message (also the `DisruptionTarget` condition's).
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The rejection reason of pods arriving during the shutdown.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
/// Its message.
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// What the `Ready` condition says during the shutdown.
pub const SHUTTING_DOWN: &str = "node is shutting down";
/// The state file in the root directory.
pub const STATE_FILE: &str = "graceful_node_shutdown_state";
/// The node event reason.
pub const EVENT_REASON: &str = "NodeShutdown";
/// How long after a lost bus connection the manager connects again.
pub const DBUS_RECONNECT_PERIOD: Duration = Duration::from_secs(1);
/// `scheduling.DefaultPriorityWhenNoDefaultClassExists`.
pub const DEFAULT_PRIORITY: i32 = 0;

/// Errors of the shutdown manager's start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("system bus at {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: zbus::Error,
    },
    #[error("failed reading InhibitDelayMaxUSec property from logind: {0}")]
    InhibitDelay(#[source] zbus::Error),
    #[error("failed creating systemd inhibitor: {0}")]
    Inhibit(#[source] zbus::Error),
    #[error("unable to reload logind conf: {0}")]
    Reload(#[source] zbus::Error),
    #[error("failed to monitor shutdown: {0}")]
    Monitor(#[source] zbus::Error),
    #[error("unable to override inhibit delay by shutdown manager: {0}")]
    Override(String),
    #[error(
        "node shutdown manager was timed out after {attempts} attempts waiting for logind InhibitDelayMaxSec to \
         update to {requested} (ShutdownGracePeriod), current value is {current}"
    )]
    InhibitDelayTooSmall { attempts: u32, requested: String, current: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One `shutdownGracePeriodByPodPriority` entry: pods from `priority` up (to the next
/// entry) get `grace_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityPeriod {
    pub priority: i32,
    pub grace_seconds: i64,
}

/// The graceful node shutdown settings, as `settings::node_shutdown` takes them from the
/// `KubeletConfiguration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownSettings {
    /// The `GracefulNodeShutdown` feature gate (on unless set false): off, shutdown is
    /// immediate.
    pub graceful_node_shutdown: bool,
    /// The `GracefulNodeShutdownBasedOnPodPriority` feature gate (on unless set false):
    /// [`Self::by_pod_priority`] is used, and shutdown events are recorded.
    pub based_on_pod_priority: bool,
    /// `shutdownGracePeriod`.
    pub shutdown_grace_period: Duration,
    /// `shutdownGracePeriodCriticalPods`.
    pub shutdown_grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority`, as given.
    pub by_pod_priority: Vec<PriorityPeriod>,
}

/// The groups of the settings, lowest priority first; empty means the feature is off.
#[must_use]
pub fn periods(settings: &ShutdownSettings) -> Vec<PriorityPeriod> {
    if !settings.graceful_node_shutdown {
        return Vec::new();
    }
    let mut periods: Vec<PriorityPeriod> = if settings.based_on_pod_priority && !settings.by_pod_priority.is_empty() {
        settings.by_pod_priority.clone()
    } else {
        migrate(settings.shutdown_grace_period, settings.shutdown_grace_period_critical_pods)
    };
    periods.sort_by_key(|p| p.priority);
    periods
}

/// `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` as two priority groups
/// (nothing when the total is 0 or the critical part exceeds it).
#[must_use]
pub fn migrate(total: Duration, critical: Duration) -> Vec<PriorityPeriod> {
    let Some(regular) = total.checked_sub(critical).filter(|_| !total.is_zero()) else { return Vec::new() };
    vec![
        PriorityPeriod { priority: DEFAULT_PRIORITY, grace_seconds: regular.as_secs() as i64 },
        PriorityPeriod { priority: SYSTEM_CRITICAL_PRIORITY, grace_seconds: critical.as_secs() as i64 },
    ]
}

/// How long logind must let the shutdown wait: every group's period.
#[must_use]
pub fn period_requested(periods: &[PriorityPeriod]) -> Duration {
    let secs: i64 = periods.iter().map(|p| p.grace_seconds).sum();
    Duration::from_secs(secs.max(0) as u64)
}

/// The pods of one priority range.
#[derive(Clone, Debug)]
pub struct Group {
    pub period: PriorityPeriod,
    pub pods: Vec<Pod>,
}

/// Sorts `pods` into the groups of `periods` (sorted, lowest priority first): a pod
/// belongs to the highest group whose priority is at most its own; pods below the
/// lowest group go to the lowest, pods above the highest to the highest.
#[must_use]
pub fn group_by_priority(periods: &[PriorityPeriod], pods: Vec<Pod>) -> Vec<Group> {
    let mut groups: Vec<Group> = periods.iter().map(|&period| Group { period, pods: Vec::new() }).collect();
    if groups.is_empty() {
        return groups;
    }
    for pod in pods {
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        // The first group at or above the pod's priority; the one below it when that
        // group starts above the pod; the highest group for pods above every group.
        let first_at_or_above = groups.partition_point(|g| g.period.priority < priority);
        let index = if first_at_or_above == groups.len() {
            groups.len() - 1
        } else if first_at_or_above > 0 && groups[first_at_or_above].period.priority > priority {
            first_at_or_above - 1
        } else {
            first_at_or_above
        };
        groups[index].pods.push(pod);
    }
    groups
}

/// The grace period a pod gets in its group: the group's, or the pod's own
/// `terminationGracePeriodSeconds` when that is not longer.
#[must_use]
pub fn effective_grace(pod: &Pod, group_grace: i64) -> i64 {
    match pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds) {
        Some(own) if own <= group_grace => own,
        _ => group_grace,
    }
}

/// What the pod worker writes into the status of a pod terminated for the shutdown.
pub fn apply_shutdown_status(status: &mut PodStatus, now: Time) {
    if status.phase.as_deref() != Some("Succeeded") {
        status.phase = Some("Failed".to_owned());
    }
    status.reason = Some(REASON.to_owned());
    status.message = Some(MESSAGE.to_owned());
    let condition = crate::eviction::messages::disruption_target_condition(MESSAGE);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            let transition =
                if existing.status == condition.status { existing.last_transition_time.clone() } else { None };
            *existing = PodCondition { last_transition_time: transition.or(Some(now)), ..condition };
        }
        None => conditions.push(PodCondition { last_transition_time: Some(now), ..condition }),
    }
}

/// Whether the node is shutting down: read by admission and the node's `Ready`
/// condition, set by the [`Manager`].
#[derive(Clone, Debug, Default)]
pub struct ShutdownStatus(Arc<AtomicBool>);

impl ShutdownStatus {
    /// `Err("node is shutting down")` while it is (upstream `ShutdownStatus`).
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.0.load(Ordering::SeqCst) { Err(SHUTTING_DOWN.to_owned()) } else { Ok(()) }
    }

    pub(crate) fn set(&self, shutting_down: bool) {
        self.0.store(shutting_down, Ordering::SeqCst);
    }
}

impl PodAdmitHandler for ShutdownStatus {
    fn admit(&self, pod: &Pod, _active: &[Pod]) -> std::result::Result<(), Rejection> {
        if self.check().is_ok() {
            return Ok(());
        }
        tracing::info!(pod = ?pod.metadata.name, "rejecting pod: the node is shutting down");
        Err(Rejection { reason: NOT_ADMITTED_REASON.to_owned(), message: NOT_ADMITTED_MESSAGE.to_owned() })
    }
}

/// Boxed error of the injected kill.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Terminates one pod for the shutdown (upstream `killPodFunc`).
#[async_trait]
pub trait PodTerminator: Send + Sync {
    /// Stops `pod` with `grace` seconds and sets its status with
    /// [`apply_shutdown_status`]; returns once its containers are stopped.
    async fn terminate(&self, pod: &Pod, grace: i64) -> Result<(), BoxError>;
}

/// Terminates `pods` group by group, lowest priority first; a group's pods in
/// parallel, and the next group once they all stopped or the group's period is over.
pub async fn kill_pods(periods: &[PriorityPeriod], pods: Vec<Pod>, terminator: &Arc<dyn PodTerminator>) {
    for group in group_by_priority(periods, pods) {
        if group.pods.is_empty() {
            continue;
        }
        let mut kills = tokio::task::JoinSet::new();
        for pod in group.pods {
            let grace = effective_grace(&pod, group.period.grace_seconds);
            let terminator = terminator.clone();
            kills.spawn(async move {
                let name = pod.metadata.name.clone().unwrap_or_default();
                tracing::debug!(pod = %name, grace, "shutdown manager killing pod");
                match terminator.terminate(&pod, grace).await {
                    Ok(()) => tracing::debug!(pod = %name, "shutdown manager finished killing pod"),
                    Err(e) => tracing::info!(pod = %name, error = %e, "shutdown manager failed killing pod"),
                }
            });
        }
        let wait = Duration::from_secs(group.period.grace_seconds.max(0) as u64);
        let all_done = async { while kills.join_next().await.is_some() {} };
        if tokio::time::timeout(wait, all_done).await.is_err() {
            tracing::info!(
                grace_period = group.period.grace_seconds,
                priority = group.period.priority,
                "shutdown manager pod killing time out"
            );
            // The kills already asked go on in the pod workers; only the waiting stops.
            kills.detach_all();
        } else {
            tracing::debug!(
                grace_period = group.period.grace_seconds,
                priority = group.period.priority,
                "done waiting for all pods in group to terminate"
            );
        }
    }
}

/// The active pods (admitted, not terminal), as the eviction manager sees them.
pub type ActivePodsFn = Arc<dyn Fn() -> Vec<Pod> + Send + Sync>;

/// The node shutdown manager (upstream `managerImpl`).
#[derive(Clone)]
pub struct Manager {
    periods: Vec<PriorityPeriod>,
    status: ShutdownStatus,
    active_pods: ActivePodsFn,
    terminator: Arc<dyn PodTerminator>,
    storage: storage::Storage,
    /// State file and metrics (upstream: only with `GracefulNodeShutdownBasedOnPodPriority`).
    record: bool,
    logind_conf_dir: std::path::PathBuf,
    /// The system bus; `None`: `DBUS_SYSTEM_BUS_ADDRESS` at each connection, as upstream.
    bus_address: Option<String>,
    metrics: Option<Arc<ShutdownMetrics>>,
    recorder: Option<(Arc<dyn EventRecorder>, String)>,
    node_sync: Option<Arc<Notify>>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").field("periods", &self.periods).field("status", &self.status).finish_non_exhaustive()
    }
}

impl Manager {
    /// A manager for `periods` (see [`periods`]; must not be empty), keeping its state
    /// file in `root_dir`.
    #[must_use]
    pub fn new(
        periods: Vec<PriorityPeriod>,
        root_dir: &std::path::Path,
        active_pods: ActivePodsFn,
        terminator: Arc<dyn PodTerminator>,
    ) -> Self {
        let logind_conf_dir = std::env::var_os("SWIFTLET_LOGIND_CONF_DIR")
            .map_or_else(|| std::path::PathBuf::from(systemd::LOGIND_CONF_DIR), std::path::PathBuf::from);
        Self {
            periods,
            status: ShutdownStatus::default(),
            active_pods,
            terminator,
            storage: storage::Storage::new(root_dir.join(STATE_FILE)),
            record: true,
            logind_conf_dir,
            bus_address: None,
            metrics: None,
            recorder: None,
            node_sync: None,
        }
    }

    /// The agent's manager: `None` (logged) when the settings turn the feature off; else
    /// one that asks `active_pods` for the pods to stop and stops them with `terminator`
    /// (the agent's is [`adapters::AgentTerminator`], through the pod workers).
    #[must_use]
    pub fn from_settings(
        settings: &ShutdownSettings,
        root_dir: &std::path::Path,
        active_pods: ActivePodsFn,
        terminator: Arc<dyn PodTerminator>,
    ) -> Option<Self> {
        let periods = periods(settings);
        if periods.is_empty() {
            tracing::info!("no graceful node shutdown configured, node shutdown will be immediate");
            return None;
        }
        let mut manager = Self::new(periods, root_dir, active_pods, terminator);
        manager.record = settings.based_on_pod_priority;
        Some(manager)
    }

    /// Sets `kubelet_graceful_shutdown_{start,end}_time_seconds`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<ShutdownMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Records `NodeShutdown` events on node `node_name`.
    #[must_use]
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>, node_name: &str) -> Self {
        self.recorder = Some((recorder, node_name.to_owned()));
        self
    }

    /// Wakes the node status loop when the shutdown starts (upstream `syncNodeStatus`).
    #[must_use]
    pub fn with_node_sync(mut self, notify: Arc<Notify>) -> Self {
        self.node_sync = Some(notify);
        self
    }

    /// Writes the logind drop-in into `dir` instead (tests).
    #[must_use]
    pub fn with_logind_conf_dir(mut self, dir: std::path::PathBuf) -> Self {
        self.logind_conf_dir = dir;
        self
    }

    /// Connects to the bus at `address` instead of the system bus (tests).
    #[must_use]
    pub fn with_bus_address(mut self, address: &str) -> Self {
        self.bus_address = Some(address.to_owned());
        self
    }

    /// The shared shutdown status (admission and the `Ready` condition).
    #[must_use]
    pub fn status(&self) -> ShutdownStatus {
        self.status.clone()
    }

    /// Connects, takes the lock and handles shutdown events until `shutdown`; after a
    /// lost connection it connects again every second. A first start that fails is
    /// logged and ends the manager, as upstream.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(periods = ?self.periods, "creating node shutdown manager");
        let (mut bus, mut events, mut lock) = match self.connect().await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "Failed to start node shutdown manager");
                return;
            }
        };
        self.load_metrics();
        loop {
            self.watch(&bus, events, &mut lock, &shutdown).await;
            // Ends the connection and releases the lock (if still held).
            drop((bus, lock));
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(DBUS_RECONNECT_PERIOD) => {}
                }
                tracing::debug!("restarting watch for node shutdown events");
                match self.connect().await {
                    Ok(s) => {
                        (bus, events, lock) = s;
                        break;
                    }
                    Err(e) => tracing::error!(error = %e, "unable to watch the node for shutdown events"),
                }
            }
        }
    }

    async fn connect(&self) -> Result<(DbusInhibiter, mpsc::Receiver<bool>, InhibitLock)> {
        let bus = match &self.bus_address {
            Some(address) => DbusInhibiter::connect_to(address).await?,
            None => DbusInhibiter::connect().await?,
        };
        let (events, lock) = self.start_watching(&bus).await?;
        Ok((bus, events, lock))
    }

    /// Makes logind's delay long enough, subscribes to the signal and takes the lock.
    pub async fn start_watching(&self, bus: &dyn Inhibiter) -> Result<(mpsc::Receiver<bool>, InhibitLock)> {
        let current = bus.current_inhibit_delay().await?;
        let requested = period_requested(&self.periods);
        if requested > current {
            systemd::override_inhibit_delay(&self.logind_conf_dir, requested).map_err(Error::Override)?;
            bus.reload_logind_conf().await?;
            // The reload is asynchronous: read again with a growing pause.
            let mut pause = Duration::from_millis(100);
            let mut attempts = 0;
            loop {
                attempts += 1;
                let updated = bus.current_inhibit_delay().await?;
                if updated >= requested {
                    break;
                }
                if attempts == 5 {
                    return Err(Error::InhibitDelayTooSmall {
                        attempts,
                        requested: go_duration(requested),
                        current: go_duration(updated),
                    });
                }
                tracing::debug!(attempts, current = ?updated, ?requested, "InhibitDelayMaxSec still less than requested, retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        // Subscribed before the lock is taken (upstream takes the lock first): logind may
        // announce a shutdown as soon as the lock exists, and a signal sent before the bus
        // has our match rule is lost, leaving logind waiting out the whole delay.
        let events = bus.monitor_shutdown().await?;
        let lock = bus.inhibit_shutdown().await?;
        Ok((events, lock))
    }

    /// Handles shutdown events until the bus goes away or `shutdown`.
    pub async fn watch(
        &self,
        bus: &dyn Inhibiter,
        mut events: mpsc::Receiver<bool>,
        lock: &mut InhibitLock,
        shutdown: &CancellationToken,
    ) {
        loop {
            let shutting_down = tokio::select! {
                () = shutdown.cancelled() => return,
                e = events.recv() => e,
            };
            let Some(shutting_down) = shutting_down else {
                tracing::error!("ended watching the node for shutdown events");
                return;
            };
            tracing::info!(
                event = if shutting_down { "shutdown" } else { "cancelled" },
                "shutdown manager detected new shutdown event"
            );
            if let Some((recorder, node)) = &self.recorder {
                let message = if shutting_down {
                    "Shutdown manager detected shutdown event"
                } else {
                    "Shutdown manager detected shutdown cancellation"
                };
                recorder.record(node_ref(node), EventType::Normal, EVENT_REASON, message.to_owned());
            }
            self.status.set(shutting_down);
            if shutting_down {
                if let Some(n) = &self.node_sync {
                    n.notify_one();
                }
                self.process_shutdown_event(lock).await;
            } else {
                match bus.inhibit_shutdown().await {
                    // Replacing the old lock (if still held) releases it.
                    Ok(new) => *lock = new,
                    Err(e) => tracing::warn!(error = %e, "taking the inhibitor lock again after the cancellation"),
                }
            }
        }
    }

    async fn process_shutdown_event(&self, lock: &mut InhibitLock) {
        tracing::info!("shutdown manager processing shutdown event");
        let pods = (self.active_pods)();
        let start = jiff::Timestamp::now();
        if self.record
            && let Err(e) = self.storage.store(&storage::State { start_time: Some(start), end_time: None })
        {
            tracing::error!(error = %e, "failed to store graceful shutdown state");
        }
        if let Some(m) = self.metrics.as_ref().filter(|_| self.record) {
            m.graceful_shutdown_start_time.set(storage::timestamp(Some(start)));
            m.graceful_shutdown_end_time.set(0.0);
        }
        kill_pods(&self.periods, pods, &self.terminator).await;
        let end = jiff::Timestamp::now();
        if self.record
            && let Err(e) = self.storage.store(&storage::State { start_time: Some(start), end_time: Some(end) })
        {
            tracing::error!(error = %e, "failed to store graceful shutdown state");
        }
        if let Some(m) = self.metrics.as_ref().filter(|_| self.record) {
            m.graceful_shutdown_end_time.set(storage::timestamp(Some(end)));
        }
        lock.release();
        tracing::info!("shutdown manager completed processing shutdown event, node will shutdown shortly");
    }

    /// The metrics from the state file of an earlier shutdown (upstream `setMetrics`).
    fn load_metrics(&self) {
        let Some(m) = self.metrics.as_ref().filter(|_| self.record) else { return };
        match self.storage.load() {
            Ok(state) => {
                if state.start_time.is_some() {
                    m.graceful_shutdown_start_time.set(storage::timestamp(state.start_time));
                }
                if state.end_time.is_some() {
                    m.graceful_shutdown_end_time.set(storage::timestamp(state.end_time));
                }
            }
            Err(e) => tracing::error!(error = %e, "failed to load graceful shutdown state"),
        }
    }
}

/// A duration as Go prints it (`30s`, `2m0s`).
fn go_duration(d: Duration) -> String {
    crate::types::duration::GoDuration::from_std(d).to_string()
}
