//! Pod workers (`pkg/kubelet/pod_workers.go`): one task per pod UID, so pods never
//! block each other and one pod never has two syncs at once.
//!
//! Each worker is a state machine:
//! - [`WorkerState::Syncing`]: `SyncPod` on every update, PLEG event and resync
//!   (`syncFrequency` with 0–50 % jitter, or sooner when a back-off expires). A pod
//!   whose phase becomes terminal (all containers done for good) moves on.
//! - [`WorkerState::Terminating`]: `SyncTerminatingPod` stops every container with the
//!   grace period (SIGTERM, then SIGKILL) and the sandbox; retried until it succeeds.
//! - [`WorkerState::Terminated`]: `SyncTerminatedPod` removes the pod cgroup. A pod
//!   that is still desired (completed) stays here with its final status; a pod that
//!   was removed has its containers, sandboxes and directories removed and the worker
//!   ends ([`WorkerState::Finished`]).
//!
//! A PLEG event that a container (or sandbox) started, when the status the worker last
//! computed already shows it running or past that, brings nothing to sync: the worker
//! read the runtime after its own start calls returned (see `sync_pod`), and what
//! follows a start (an exit, a removal) comes as an event of its own. Upstream syncs on
//! every event; here such an event is dropped, which spares a pod that the worker just
//! started one full sync (four CRI calls, the cgroup and volume checks) per container,
//! in a burst when the runtime has the least time for it.
//!
//! Shutdown stops a worker at once, even in the middle of a runtime call: the pod is left
//! as it is (the kubelet leaves pods running when it stops), and the next agent picks
//! it up from the runtime.
//!
//! Static pods that share a full name (an edited manifest gets a new UID) start only
//! after the previous instance finished, as upstream.
//!
//! A pod removed and added again under the same UID while its worker terminates it (a
//! static pod's UID is a hash of its manifest, so deleting and restoring the file does
//! this) is restarted: the `Create` marks the worker (upstream `restartRequested`), the
//! termination runs to its end (containers, sandbox, cgroup, volumes and directories
//! removed), and the same worker then starts the pod afresh as a new instance, counted in
//! `kubelet_restarted_pods`. Upstream's housekeeping does the same in two steps
//! (`SyncKnownPods` drops the finished worker, `HandlePodCleanups` sends a `Create` for
//! the desired pod without one and counts it); restarting in place keeps every later
//! update of the UID in the one mailbox, so none can reach a worker about to end.
//!
//! What is sent to a worker waits in one pending slot per pod (upstream's
//! `pendingUpdate`), not a queue: updates sent while the worker syncs merge into it (the
//! latest pod, the strongest kind, the order of a kill and a create), so a pod sent a
//! thousand updates during one long image pull holds one pod object, and the worker takes
//! them in at its next look in one step.

pub mod metrics;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use rand::Rng as _;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::allocation::pod_level::set_pod_level_status;
use crate::cm::PodContainerManager;
use crate::container::{RuntimePod, RuntimePodStatus};
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::metrics::OperationLabels;
use crate::runtime::RuntimeManager;
use crate::status::{StatusInputs, StatusProvider, generate_api_pod_status};
use crate::types::pod::{is_static_pod, pod_full_name};
use metrics::PodWorkerMetrics;

/// Upstream `backOffPeriod` used to requeue a pod whose sync failed.
const ERROR_REQUEUE: Duration = Duration::from_secs(10);
/// How often a failed termination is retried.
const TERMINATION_RETRY: Duration = Duration::from_secs(1);

/// What the sync loop asks of a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkType {
    Create,
    Update,
    Sync,
    /// Terminate the pod; it is no longer desired. `grace` overrides the pod's own.
    Kill {
        grace: Option<i64>,
    },
    /// Terminate the pod but keep it (evicted: it stays, `Failed`, until its source
    /// removes it; it never starts again). `grace` overrides the pod's own.
    Evict {
        grace: Option<i64>,
    },
}

/// A change applied to every status the worker computes for a pod from now on (an
/// eviction's `Failed`/`Evicted`).
pub type StatusOverride = Arc<dyn Fn(&mut k8s_openapi::api::core::v1::PodStatus) + Send + Sync>;

impl WorkType {
    fn metric_label(&self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Sync => "sync",
            Self::Kill { .. } | Self::Evict { .. } => "kill",
        }
    }
}

/// Lifecycle of a pod worker (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    Syncing,
    Terminating,
    Terminated,
    Finished,
}

/// Everything a worker needs (upstream: the `Kubelet` struct).
#[derive(Debug)]
pub struct SyncDeps {
    pub runtime: Arc<RuntimeManager>,
    pub cm: Arc<dyn PodContainerManager>,
    pub status: Arc<dyn StatusProvider>,
    pub metrics: Arc<PodWorkerMetrics>,
    pub recorder: Arc<dyn EventRecorder>,
    pub runtime_name: String,
    pub sync_frequency: Duration,
    pub host_ip: Option<String>,
    /// The runtime's state: a pod on the pod network does not start while the runtime
    /// says the network is not ready (upstream's `networkErrors` check in `SyncPod`).
    pub runtime_state: Option<Arc<crate::container::runtime_state::RuntimeState>>,
    /// Where the agent's records go (the event API's `POD_STATUS_COMPUTED`, and the sync
    /// loop's `PLEG_EVENT_DISPATCHED` through [`PodWorkers::records`]).
    pub records: crate::event_api::EventBus,
}

#[derive(Debug)]
struct Work {
    pod: Option<Pod>,
    kind: WorkType,
    /// A PLEG event's: this container (or sandbox) started.
    started: Option<String>,
}

/// What a worker has not taken in yet: everything sent since it last looked, merged into
/// one update as it arrives (upstream's per-pod `pendingUpdate` slot), so a pod sent a
/// thousand updates during one long sync holds one pod object, not a thousand.
#[derive(Debug, Default)]
struct Pending {
    /// The latest pod sent.
    pod: Option<Pod>,
    /// The strongest kind sent ([`merge_kind`]); `None`: nothing was sent.
    kind: Option<WorkType>,
    /// A kill was sent: the pod is no longer desired.
    killed: bool,
    /// A create (with a pod) came after the last kill, or without one: if the pod is no
    /// longer desired, it restarts once terminated.
    created_after_kill: bool,
    /// Containers (or sandboxes) that PLEG events said started: news only if the status
    /// does not show them yet.
    started: Vec<String>,
    /// Anything else was sent (always news).
    other: bool,
}

impl Pending {
    /// Adds `w`, in the order it was sent.
    fn add(&mut self, w: Work) {
        match &w.kind {
            WorkType::Kill { .. } => {
                self.killed = true;
                self.created_after_kill = false;
            }
            WorkType::Create if w.pod.is_some() => self.created_after_kill = true,
            _ => {}
        }
        match (&w.kind, w.started) {
            (WorkType::Sync, Some(id)) => self.started.push(id),
            _ => self.other = true,
        }
        self.kind = Some(match self.kind.take() {
            Some(k) => merge_kind(k, w.kind),
            None => w.kind,
        });
        if w.pod.is_some() {
            self.pod = w.pod;
        }
    }
}

/// One worker's pending slot and its wake-up.
#[derive(Debug, Default)]
struct Mailbox {
    /// The pending update, and whether the worker has stopped taking any.
    slot: Mutex<(Pending, bool)>,
    wake: Notify,
}

impl Mailbox {
    /// Merges `w` into the slot and wakes the worker; gives `w` back if the worker is gone.
    fn send(&self, w: Work) -> Result<(), Box<Work>> {
        let mut slot = self.slot.lock().unwrap();
        if slot.1 {
            return Err(Box::new(w));
        }
        slot.0.add(w);
        drop(slot);
        self.wake.notify_one();
        Ok(())
    }

    /// Everything sent since the last take, if anything was.
    fn take(&self) -> Option<Pending> {
        let pending = std::mem::take(&mut self.slot.lock().unwrap().0);
        pending.kind.is_some().then_some(pending)
    }

    fn close(&self) {
        self.slot.lock().unwrap().1 = true;
    }
}

/// Closes the worker's mailbox however its task ends (finished, shut down, panicked).
struct CloseOnDrop(Arc<Mailbox>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[derive(Debug)]
struct Handle {
    mailbox: Arc<Mailbox>,
    state: WorkerState,
    full_name: (String, String),
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("workers", &self.workers)
            .field("overrides", &self.overrides.keys().collect::<Vec<_>>())
            .field("claimed", &self.claimed)
            .field("finished", &self.finished)
            .finish()
    }
}

#[derive(Default)]
struct Registry {
    workers: HashMap<String, Handle>,
    /// Status overrides by pod UID (evictions), until the worker finishes.
    overrides: HashMap<String, StatusOverride>,
    /// UIDs whose leftovers housekeeping is removing ([`CleanupClaim`]).
    claimed: HashSet<String>,
    /// API pods being deleted whose worker has finished while the API still has them (a
    /// finalizer holds the object): updates of theirs are ignored until they leave their
    /// source (upstream keeps a finished `podSyncStatus` until `SyncKnownPods`), so no new
    /// worker overwrites their final status with one of a pod that has nothing left.
    finished: HashSet<String>,
}

/// Housekeeping's right to remove what a pod UID left behind (its cgroup, pod and log
/// directories): granted only while the UID has no worker, and while it is held a new
/// worker for the UID waits before it creates anything. Checked and granted under the
/// registry's lock, where workers are registered too, so a pod admitted while a clean-up
/// pass runs either has a worker the pass sees, or starts after the removal.
#[derive(Debug)]
pub struct CleanupClaim {
    registry: Arc<Mutex<Registry>>,
    released: Arc<Notify>,
    uid: String,
}

impl Drop for CleanupClaim {
    fn drop(&mut self) {
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner).claimed.remove(&self.uid);
        self.released.notify_waiters();
    }
}

/// The set of pod workers.
#[derive(Debug, Clone)]
pub struct PodWorkers {
    deps: Arc<SyncDeps>,
    registry: Arc<Mutex<Registry>>,
    finished: Arc<Notify>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

/// The event API's `POD_STATUS_COMPUTED` record of `status`, computed now for `pod`: what
/// `cargo xtask bench` times a container's state change by.
fn status_record(pod: &Pod, status: &k8s_openapi::api::core::v1::PodStatus) -> crate::event_api::NodeEvent {
    let containers = [&status.init_container_statuses, &status.container_statuses]
        .into_iter()
        .flatten()
        .flatten()
        .map(|c| {
            let st = c.state.as_ref();
            let state = if st.is_some_and(|s| s.running.is_some()) {
                "running"
            } else if st.is_some_and(|s| s.terminated.is_some()) {
                "terminated"
            } else {
                "waiting"
            };
            crate::event_api::ContainerSummary {
                name: c.name.clone(),
                state,
                restart_count: u32::try_from(c.restart_count).unwrap_or(0),
            }
        })
        .collect();
    crate::event_api::NodeEvent {
        agent_time_ns: Some(crate::types::clock::monotonic_now_ns()),
        containers,
        ..crate::event_api::NodeEvent::for_pod(crate::event_api::NodeEventKind::PodStatusComputed, pod)
    }
}

fn full_name_of(pod: &Pod) -> (String, String) {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

impl PodWorkers {
    /// Where the agent's records go ([`SyncDeps::records`]).
    #[must_use]
    pub fn records(&self) -> &crate::event_api::EventBus {
        &self.deps.records
    }

    #[must_use]
    pub fn new(deps: Arc<SyncDeps>, tracker: TaskTracker, shutdown: CancellationToken) -> Self {
        Self { deps, registry: Arc::default(), finished: Arc::new(Notify::new()), tracker, shutdown }
    }

    /// Sends work for a pod, starting its worker if needed (upstream `UpdatePod`).
    pub fn update_pod(&self, pod: Pod, kind: WorkType) {
        self.send(pod, kind, None);
    }

    /// A PLEG event that container (or sandbox) `id` of `pod` started: a sync, unless the
    /// pod's status already shows it running (see the module docs).
    pub fn container_started(&self, pod: Pod, id: String) {
        self.send(pod, WorkType::Sync, Some(id));
    }

    fn send(&self, pod: Pod, kind: WorkType, started: Option<String>) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let work = Work { pod: Some(pod), kind, started };
        let mut reg = self.registry.lock().unwrap();
        if reg.finished.contains(&uid) {
            return;
        }
        let work = match reg.workers.get(&uid) {
            Some(h) => match h.mailbox.send(work) {
                Ok(()) => return,
                Err(w) => *w,
            },
            None => work,
        };
        let pod = work.pod.clone().expect("sent with a pod");
        let full_name = full_name_of(&pod);
        let mailbox = Arc::new(Mailbox::default());
        mailbox.send(work).expect("a new mailbox is open");
        reg.workers.insert(
            uid.clone(),
            Handle { mailbox: mailbox.clone(), state: WorkerState::Syncing, full_name: full_name.clone() },
        );
        drop(reg);
        self.spawn(&uid, Some(pod), mailbox, WorkerState::Syncing);
    }

    /// Forgets a finished pod that left its source; true if it was one (nothing is left
    /// to do for it).
    #[must_use = "true means nothing is left to do for the pod"]
    pub fn forget_finished(&self, uid: &str) -> bool {
        self.registry.lock().unwrap().finished.remove(uid)
    }

    /// Keeps only the finished pods `known` still says their source has.
    pub fn retain_finished(&self, known: impl Fn(&str) -> bool) {
        self.registry.lock().unwrap().finished.retain(|uid| known(uid));
    }

    /// Terminates a pod that only the runtime knows (upstream "runtime-only pods").
    pub fn kill_orphan(&self, rp: &RuntimePod) {
        let mut reg = self.registry.lock().unwrap();
        if reg.workers.contains_key(&rp.uid) {
            return;
        }
        self.deps.metrics.orphaned_runtime_pods.inc();
        let mailbox = Arc::new(Mailbox::default());
        mailbox
            .send(Work { pod: None, kind: WorkType::Kill { grace: None }, started: None })
            .expect("a new mailbox is open");
        reg.workers.insert(
            rp.uid.clone(),
            Handle {
                mailbox: mailbox.clone(),
                state: WorkerState::Terminating,
                full_name: (rp.namespace.clone(), rp.name.clone()),
            },
        );
        drop(reg);
        tracing::info!(uid = %rp.uid, pod = %format!("{}/{}", rp.namespace, rp.name), "killing orphaned runtime pod");
        self.spawn(&rp.uid, None, mailbox, WorkerState::Terminating);
    }

    fn spawn(&self, uid: &str, pod: Option<Pod>, mailbox: Arc<Mailbox>, state: WorkerState) {
        let worker = Worker {
            uid: uid.to_string(),
            pod,
            state,
            desired: true,
            grace: None,
            restart_requested: false,
            deps: self.deps.clone(),
            workers: self.clone(),
            first_seen: SystemTime::now(),
            started_once: false,
            last_sync_failed: false,
            seen_started: HashSet::new(),
            last_change_started: None,
        };
        let span = tracing::info_span!("pod_worker", pod_uid = %uid);
        let shutdown = self.shutdown.clone();
        self.tracker.spawn(worker.run(mailbox, shutdown).instrument(span));
    }

    fn set_state(&self, uid: &str, state: WorkerState) {
        self.set_state_of(uid, state, false);
    }

    /// [`Self::set_state`]; `deleted_api_pod`: a finished worker terminated an API pod
    /// being deleted, whose later updates are ignored (see `Registry::finished`).
    fn set_state_of(&self, uid: &str, state: WorkerState, deleted_api_pod: bool) {
        let mut reg = self.registry.lock().unwrap();
        if state == WorkerState::Finished {
            if deleted_api_pod {
                reg.finished.insert(uid.to_owned());
            }
            reg.workers.remove(uid);
            reg.overrides.remove(uid);
            drop(reg);
            self.finished.notify_waiters();
        } else if let Some(h) = reg.workers.get_mut(uid) {
            h.state = state;
        }
    }

    /// Whether another worker with the same full name exists (a previous instance of a
    /// static pod that has not finished terminating).
    fn name_busy(&self, uid: &str, full_name: &(String, String)) -> bool {
        let reg = self.registry.lock().unwrap();
        reg.workers.iter().any(|(u, h)| u != uid && &h.full_name == full_name)
    }

    /// UIDs with a worker, and their state.
    #[must_use]
    pub fn states(&self) -> HashMap<String, WorkerState> {
        self.registry.lock().unwrap().workers.iter().map(|(u, h)| (u.clone(), h.state)).collect()
    }

    /// Evicts `pod`: from now on every status of it goes through `status` (phase
    /// `Failed`, reason `Evicted`, ...), and it is terminated with `grace` (seconds; 0:
    /// at once) but stays known, as upstream keeps an evicted pod until its source
    /// deletes it.
    pub fn evict(&self, pod: Pod, grace: i64, status: StatusOverride) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.registry.lock().unwrap().overrides.insert(uid, status);
        self.update_pod(pod, WorkType::Evict { grace: Some(grace) });
    }

    fn status_override(&self, uid: &str) -> Option<StatusOverride> {
        self.registry.lock().unwrap().overrides.get(uid).cloned()
    }

    /// Whether `uid` has a worker that has not terminated the pod yet.
    #[must_use]
    pub fn is_running(&self, uid: &str) -> bool {
        self.registry.lock().unwrap().workers.get(uid).is_some_and(|h| h.state == WorkerState::Syncing)
    }

    /// Claims `uid` for housekeeping's removal of its leftovers; `None` while the UID
    /// has a worker (or another claim).
    #[must_use]
    pub fn claim_for_cleanup(&self, uid: &str) -> Option<CleanupClaim> {
        let mut reg = self.registry.lock().unwrap();
        if reg.workers.contains_key(uid) || !reg.claimed.insert(uid.to_owned()) {
            return None;
        }
        Some(CleanupClaim { registry: self.registry.clone(), released: self.finished.clone(), uid: uid.to_owned() })
    }

    /// Waits until housekeeping holds no claim on `uid`.
    async fn wait_unclaimed(&self, uid: &str) {
        loop {
            let released = self.finished.notified();
            if !self.registry.lock().unwrap().claimed.contains(uid) {
                return;
            }
            tracing::debug!("waiting for housekeeping to finish removing what an earlier pod of this UID left");
            released.await;
        }
    }

    /// UIDs that have a worker.
    #[must_use]
    pub fn known_uids(&self) -> HashSet<String> {
        self.registry.lock().unwrap().workers.keys().cloned().collect()
    }

    /// Waits until no worker exists for `uid` (tests and shutdown helpers).
    pub async fn wait_finished(&self, uid: &str) {
        loop {
            let notified = self.finished.notified();
            if !self.registry.lock().unwrap().workers.contains_key(uid) {
                return;
            }
            notified.await;
        }
    }
}

// Four independent facts of one worker (desired, restart requested, started once, last
// sync failed), not a state that an enum would say better.
#[allow(clippy::struct_excessive_bools)]
struct Worker {
    uid: String,
    pod: Option<Pod>,
    state: WorkerState,
    /// False once the pod was removed from its source (or never was desired).
    desired: bool,
    grace: Option<i64>,
    /// A `Create` came after the pod was removed: start it again once terminated.
    restart_requested: bool,
    deps: Arc<SyncDeps>,
    workers: PodWorkers,
    first_seen: SystemTime,
    started_once: bool,
    /// The sandboxes and containers that the status last computed while syncing shows
    /// started (running or exited): a PLEG start of one of them is no news.
    seen_started: HashSet<String>,
    /// The last sync failed (an image pull, a start in back-off): a PLEG event of the
    /// pod is then always a reason to sync again, as upstream, so that the status moves
    /// on to `ImagePullBackOff` or `CrashLoopBackOff` at the next event rather than at
    /// the next requeue.
    last_sync_failed: bool,
    /// When the last sync that changed something in the runtime began (`None` before the
    /// first sync): a runtime status read since, with no change reported in the pod since,
    /// is current (see [`Worker::runtime_status`]).
    last_change_started: Option<tokio::time::Instant>,
}

/// The oldest kept runtime status a sync uses instead of asking the runtime: it bounds what
/// a change the PLEG has not reported (yet) can hide.
const MAX_KEPT_STATUS_AGE: Duration = Duration::from_secs(5);

/// Combines two pending work items: a kill wins, then create, update, sync.
fn merge_kind(a: WorkType, b: WorkType) -> WorkType {
    let rank = |k: &WorkType| match k {
        WorkType::Kill { .. } => 4,
        WorkType::Evict { .. } => 3,
        WorkType::Create => 2,
        WorkType::Update => 1,
        WorkType::Sync => 0,
    };
    if rank(&b) >= rank(&a) { b } else { a }
}

/// Jittered resync interval: `syncFrequency` plus 0–50 %.
fn resync_after(base: Duration) -> Duration {
    let jitter = rand::rng().random_range(0.0..0.5);
    base.mul_f64(1.0 + jitter)
}

/// Whether `result` started a sidecar (restartable init container) of `pod` that has no
/// startup probe: the init sequence may go on at once.
fn started_a_sidecar_without_startup_probe(pod: &Pod, result: &crate::runtime::manager::PodSyncResult) -> bool {
    let inits = pod.spec.as_ref().and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    result.started().any(|name| {
        inits.iter().any(|c| {
            c.name == name && crate::types::pod_resources::is_restartable_init_container(c) && c.startup_probe.is_none()
        })
    })
}

impl Worker {
    /// Takes in what was sent since the worker last looked; its kind, and whether it can
    /// change anything (all but PLEG starts the status already shows).
    ///
    /// A kill makes the pod undesired at once; a create of a pod that is no longer
    /// desired asks for a restart once its termination is done (the slot keeps the order
    /// of the two, so a kill and a create sent between two looks keep both).
    fn absorb(&mut self, p: Pending) -> (WorkType, bool) {
        let news = p.other || p.started.iter().any(|id| !self.seen_started.contains(id));
        if p.killed {
            self.desired = false;
            self.restart_requested = false;
        }
        if p.created_after_kill && !self.desired {
            tracing::info!("pod added again while it terminates; it restarts once terminated");
            self.restart_requested = true;
        }
        if let Some(pod) = p.pod {
            self.pod = Some(pod);
        }
        (p.kind.unwrap_or(WorkType::Sync), news)
    }

    /// Notes which sandboxes and containers `status`, which the pod's status was just
    /// computed from, shows started.
    fn note_started(&mut self, status: &RuntimePodStatus) {
        use crate::container::ContainerState;
        self.seen_started = status
            .sandboxes
            .iter()
            .map(|s| s.id.clone())
            .chain(
                status
                    .containers
                    .iter()
                    .filter(|c| matches!(c.state, ContainerState::Running | ContainerState::Exited))
                    .map(|c| c.id.clone()),
            )
            .collect();
    }

    fn uid(&self) -> &str {
        &self.uid
    }

    async fn run(mut self, mailbox: Arc<Mailbox>, shutdown: CancellationToken) {
        let _close = CloseOnDrop(mailbox.clone());
        if self.pod.is_none() {
            self.desired = false;
        }
        // Housekeeping may be removing what an earlier pod of this UID left behind.
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = self.workers.wait_unclaimed(&self.uid) => {}
        }
        let mut next_sync: Option<tokio::time::Instant> = None;
        let mut work: Option<WorkType> = None;
        // Whether the pending work can change anything.
        let mut news = false;
        loop {
            if work.is_none() {
                let sleep = async {
                    match next_sync {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = mailbox.wake.notified() => {}
                    () = sleep => {
                        work = Some(WorkType::Sync);
                        news = true;
                    }
                }
            }
            if let Some(p) = mailbox.take() {
                let (k, n) = self.absorb(p);
                work = Some(merge_kind(work.take().unwrap_or(WorkType::Sync), k));
                news |= n;
            }
            // A wake-up for what an earlier look already took.
            let Some(kind) = work.take() else { continue };
            if !std::mem::take(&mut news)
                && matches!(kind, WorkType::Sync)
                && self.state == WorkerState::Syncing
                && self.started_once
                && !self.last_sync_failed
            {
                tracing::trace!("PLEG start already in the pod's status: no sync");
                continue;
            }
            if let WorkType::Kill { grace } | WorkType::Evict { grace } = kind {
                self.grace = grace.or(self.grace);
                if self.state == WorkerState::Syncing {
                    self.state = WorkerState::Terminating;
                    self.workers.set_state(&self.uid, WorkerState::Terminating);
                }
            }
            if self.state == WorkerState::Syncing && !self.started_once {
                if let Some(pod) = &self.pod
                    && is_static_pod(pod)
                    && self.workers.name_busy(&self.uid, &full_name_of(pod))
                {
                    tracing::info!(pod = %pod_full_name(pod), "waiting for the previous instance of this static pod to terminate");
                    work = Some(kind);
                    news = true;
                    let notified = self.workers.finished.notified();
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = notified => {}
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    continue;
                }
                self.started_once = true;
                self.deps
                    .metrics
                    .pod_worker_start_duration
                    .observe(self.first_seen.elapsed().unwrap_or_default().as_secs_f64());
            }
            let start = Instant::now();
            // Shutdown stops the worker at once, whatever runtime call it is in: the pod
            // is left as it is, and the next agent takes it from there.
            let (after, follow_up) = tokio::select! {
                () = shutdown.cancelled() => return,
                step = self.step(&kind) => step,
            };
            next_sync = after;
            if let Some(k) = follow_up {
                work = Some(k);
                news = true;
            }
            self.deps
                .metrics
                .pod_worker_duration
                .get_or_create(&OperationLabels { operation_type: kind.metric_label().into() })
                .observe(start.elapsed().as_secs_f64());
            if self.state == WorkerState::Finished {
                if let Some(pod) = &self.pod {
                    self.deps.status.pod_finished(pod);
                }
                let deleted_api_pod =
                    self.pod.as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_some() && !is_static_pod(p));
                self.workers.set_state_of(&self.uid, WorkerState::Finished, deleted_api_pod && !self.desired);
                self.deps.runtime.startup_tracker().forget(&self.uid);
                self.deps.runtime.cache().forget(&self.uid);
                tracing::info!("pod worker finished");
                return;
            }
        }
    }

    /// One step of the state machine for `kind` of work: when to sync again, and the
    /// work to do next at once, if any.
    async fn step(&mut self, kind: &WorkType) -> (Option<tokio::time::Instant>, Option<WorkType>) {
        match self.state {
            WorkerState::Syncing => {
                let deadline = self.active_deadline_left();
                if deadline.is_some_and(|left| left.is_zero()) {
                    self.deadline_exceeded();
                    return (None, Some(WorkType::Evict { grace: None }));
                }
                let span = crate::telemetry::sync_pod_span(&self.uid, self.pod.as_ref(), kind.metric_label());
                // Until the pod is Ready, its syncs are steps of its start trace.
                if let Some(root) = self.deps.runtime.startup_tracker().trace_root(&self.uid) {
                    crate::telemetry::set_trace_parent(&span, &root);
                }
                let after = Box::pin(self.sync_pod().instrument(span)).await;
                // Look again when the active deadline passes, if that comes first.
                let after = deadline.map_or(after, |left| after.min(left));
                (Some(tokio::time::Instant::now() + after), None)
            }
            WorkerState::Terminating => {
                let span = crate::telemetry::sync_terminating_pod_span(&self.uid, self.pod.as_ref());
                if self.sync_terminating_pod().instrument(span).await {
                    self.state = WorkerState::Terminated;
                    self.workers.set_state(&self.uid, WorkerState::Terminated);
                    (None, Some(WorkType::Sync))
                } else {
                    (Some(tokio::time::Instant::now() + TERMINATION_RETRY), None)
                }
            }
            WorkerState::Terminated => {
                let span = crate::telemetry::sync_terminated_pod_span(&self.uid, self.pod.as_ref());
                if self.sync_terminated_pod().instrument(span).await {
                    if self.restart_requested {
                        self.restart();
                        return (None, Some(WorkType::Create));
                    }
                    if !self.desired {
                        self.state = WorkerState::Finished;
                    }
                    (None, None)
                } else {
                    (Some(tokio::time::Instant::now() + TERMINATION_RETRY), None)
                }
            }
            WorkerState::Finished => (None, None),
        }
    }

    /// Upstream `activeDeadlineHandler`: how long the pod may still be active under its
    /// `activeDeadlineSeconds`, counted from its `status.startTime` (the API's, else when
    /// this agent first saw it); `None` without a deadline.
    fn active_deadline_left(&self) -> Option<Duration> {
        let pod = self.pod.as_ref()?;
        let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
        let start =
            pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map_or(self.first_seen, |t| SystemTime::from(t.0));
        let allowed = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
        let active = SystemTime::now().duration_since(start).unwrap_or_default();
        Some(allowed.saturating_sub(active))
    }

    /// The pod outlived its `activeDeadlineSeconds`: as upstream, a `DeadlineExceeded`
    /// event, and the pod terminated and kept `Failed` with that reason.
    fn deadline_exceeded(&self) {
        const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
        let Some(pod) = &self.pod else { return };
        tracing::info!(pod = %pod_full_name(pod), "pod exceeded its activeDeadlineSeconds");
        self.deps.recorder.record(pod_ref(pod), EventType::Normal, "DeadlineExceeded", MESSAGE.into());
        let failed: StatusOverride = Arc::new(|s| {
            s.phase = Some("Failed".into());
            s.reason = Some("DeadlineExceeded".into());
            s.message = Some(MESSAGE.into());
        });
        self.workers.registry.lock().unwrap().overrides.insert(self.uid.clone(), failed);
    }

    /// The pod was added again while it terminated, and its old instance is gone now:
    /// the worker becomes the new instance's, as a fresh one would start.
    fn restart(&mut self) {
        let is_static = self.pod.as_ref().is_some_and(is_static_pod);
        tracing::info!(is_static, "restarting the pod: it was added again while it terminated");
        self.deps
            .metrics
            .restarted_pods
            .get_or_create(&crate::metrics::StaticLabels { r#static: if is_static { "true" } else { "false" }.into() })
            .inc();
        self.workers.registry.lock().unwrap().overrides.remove(&self.uid);
        {
            let t = self.deps.runtime.startup_tracker();
            t.forget(&self.uid);
            if let Some(pod) = &self.pod {
                t.begin_trace(pod);
            }
        }
        self.state = WorkerState::Syncing;
        self.workers.set_state(&self.uid, WorkerState::Syncing);
        self.desired = true;
        self.restart_requested = false;
        self.grace = None;
        self.first_seen = SystemTime::now();
        self.started_once = false;
        self.seen_started.clear();
    }

    fn start_failures(&self, pod: &Pod) -> HashMap<String, (String, String)> {
        let Some(spec) = pod.spec.as_ref() else { return HashMap::new() };
        let names = spec.containers.iter().chain(spec.init_containers.iter().flatten()).map(|c| &c.name);
        let ephemeral = spec.ephemeral_containers.iter().flatten().map(|c| &c.name);
        names
            .chain(ephemeral)
            .filter_map(|name| self.deps.runtime.start_failure(self.uid(), name).map(|f| (name.clone(), f)))
            .collect()
    }

    /// Computes and stores the API status; returns it.
    fn update_status(&self, pod: &Pod, rt: &RuntimePodStatus, terminal: bool) -> k8s_openapi::api::core::v1::PodStatus {
        let old = self.deps.status.get(self.uid());
        let failures = self.start_failures(pod);
        let qos = crate::types::qos::qos_class(pod);
        let mut status = generate_api_pod_status(
            pod,
            rt,
            &StatusInputs {
                old: old.as_ref(),
                runtime_name: &self.deps.runtime_name,
                start_failures: &failures,
                pod_is_terminal: terminal,
                start_time: Some(self.first_seen),
                host_ip: self.deps.host_ip.as_deref(),
                qos_class: qos.as_str(),
                probes: Some(self.deps.runtime.probes()),
            },
        );
        self.deps.runtime.allocation().amend_status(self.pod.as_ref().unwrap_or(pod), rt, &mut status);
        self.deps.runtime.set_allocated_resources_status(pod, &mut status);
        set_pod_level_status(pod, || self.deps.runtime.pod_cgroup_for_status(pod), old.as_ref(), &mut status);
        if let Some(apply) = self.workers.status_override(self.uid()) {
            apply(&mut status);
        }
        self.deps.runtime.probes().set_pod_status(self.uid(), &status);
        self.deps.runtime.startup_tracker().status_updated(pod, old.as_ref(), &status, self.first_seen);
        if self.deps.records.subscriber_count() > 0 {
            self.deps.records.publish(status_record(pod, &status));
        }
        self.deps.status.set(self.uid(), status.clone());
        status
    }

    /// The pod's runtime status for a sync that begins at `now` (upstream's
    /// `podCache.GetNewerThan(uid, lastSyncTime)`): the runtime cache's if it was read
    /// after the last sync that changed the runtime began (such a sync reads the runtime
    /// again once its calls returned), after the last change the PLEG reported and within
    /// [`MAX_KEPT_STATUS_AGE`]; else the runtime's own. Upstream waits for the PLEG's next
    /// relist where the cache has nothing newer; this asks the runtime.
    ///
    /// A sync woken by an exit the kernel saw writes it into the pod's status first, from
    /// the kept status with the exit laid over it, whatever the kept status' age: the exit
    /// reaches the API without waiting for a runtime that is busy recording it (on a dense
    /// node such a read takes tens of milliseconds, at worst more than 100). The status
    /// from the runtime's answer follows (it differs only if something else changed), and
    /// what the sync does (a restart) is decided on that answer.
    async fn runtime_status(&self, pod: &Pod, now: tokio::time::Instant) -> crate::container::Result<RuntimePodStatus> {
        let since =
            self.last_change_started.map(|t| now.checked_sub(MAX_KEPT_STATUS_AGE).map_or(t, |oldest| t.max(oldest)));
        let cache = self.deps.runtime.cache();
        if let Some(kept) = since.and_then(|t| cache.get_newer_than(self.uid(), t)) {
            tracing::trace!("runtime status from the cache");
            return Ok(kept);
        }
        if let Some(exited) = cache.kept_with_new_exit(self.uid()) {
            tracing::trace!("the kernel's exit into the status before the runtime's answer");
            self.update_status(pod, &exited, false);
        }
        self.deps.runtime.pod_status(self.uid()).await
    }

    /// `SyncPod`: returns when to sync again.
    async fn sync_pod(&mut self) -> Duration {
        let Some(pod) = self.pod.clone() else { return self.deps.sync_frequency };
        if pod.spec.is_none() {
            // A broken object from a source: an error for this pod alone, until an update
            // brings a spec (or the pod goes).
            let message = format!("pod {} has no spec; not syncing it", pod_full_name(&pod));
            tracing::error!(%message);
            self.deps.recorder.record(pod_ref(&pod), EventType::Warning, "FailedSync", message);
            return self.deps.sync_frequency;
        }
        // In-place resize: the pod runs with its allocated resources, not the spec's.
        let pod = self.deps.runtime.allocation().update_pod_from_allocation(&pod).0;
        let name = pod_full_name(&pod);
        let sync_started = tokio::time::Instant::now();
        let rt_status = match self.runtime_status(&pod, sync_started).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "cannot get pod status from the runtime");
                return ERROR_REQUEUE;
            }
        };
        let status = self.update_status(&pod, &rt_status, false);
        self.note_started(&rt_status);
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            tracing::info!(pod = %name, phase = ?status.phase, "pod is terminal; terminating");
            self.state = WorkerState::Terminating;
            self.workers.set_state(&self.uid, WorkerState::Terminating);
            return Duration::ZERO;
        }
        // Only pods on the host's network start while the pod network is not ready.
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        if let Some(e) = self.deps.runtime_state.as_ref().and_then(|s| s.network_error())
            && !host_network
        {
            let message = format!("network is not ready: {e}");
            tracing::warn!(pod = %name, error = %message, "not syncing the pod");
            self.deps.recorder.record(pod_ref(&pod), EventType::Warning, "NetworkNotReady", message);
            return ERROR_REQUEUE;
        }
        // Probe workers for the pod's containers (idempotent, as upstream `AddPod` in SyncPod).
        self.deps.runtime.probes().add_pod(&pod);
        // The pod's allocation on disk before its cgroup and containers are made with it:
        // admission leaves the write to here (`AllocationManager::write_admitted`).
        let allocation = self.deps.runtime.allocation();
        if allocation.has_unwritten() {
            let allocation = allocation.clone();
            tokio::task::spawn_blocking(move || allocation.write_admitted())
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        let cg_start = Instant::now();
        let cm = self.deps.cm.clone();
        let for_cgroup = pod.clone();
        // cgroup file operations block; keep them off the async workers.
        let ensured = tokio::task::spawn_blocking(move || cm.ensure_pod_cgroup(&for_cgroup))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        if let Err(e) = ensured {
            tracing::warn!(pod = %name, error = %e, "failed to create the pod cgroup");
            self.deps.recorder.record(
                pod_ref(&pod),
                EventType::Warning,
                "FailedCreatePodContainer",
                format!("unable to ensure pod container exists: {e}"),
            );
            return ERROR_REQUEUE;
        }
        self.deps
            .metrics
            .cgroup_manager_duration
            .get_or_create(&OperationLabels { operation_type: "update".into() })
            .observe(cg_start.elapsed().as_secs_f64());
        // Volumes before containers (upstream `WaitForAttachAndMount`): a volume that was
        // never set up keeps the pod waiting; a failed refresh of one in use does not.
        let volumes_span = crate::telemetry::pod_step_span("waitForAttachAndMount", "", "");
        let mounted = self.deps.runtime.volumes().mount_pod_volumes(&pod).instrument(volumes_span.clone()).await;
        if let Err(e) = &mounted {
            crate::telemetry::record_error(&volumes_span, &e.to_string());
        }
        drop(volumes_span);
        match mounted {
            Ok(volumes) => {
                for f in volumes.remount_failures() {
                    self.deps.recorder.record(pod_ref(&pod), EventType::Warning, "FailedMount", f.to_string());
                }
                for e in volumes.events() {
                    let object = e.object.clone().unwrap_or_else(|| pod_ref(&pod));
                    let type_ = if e.warning { EventType::Warning } else { EventType::Normal };
                    self.deps.recorder.record(object, type_, e.reason, e.message.clone());
                }
            }
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "volumes not ready");
                for f in e.set_up_failures() {
                    self.deps.recorder.record(pod_ref(&pod), EventType::Warning, "FailedMount", f.to_string());
                }
                let processing = e.processing_event();
                if let Some(message) = &processing {
                    self.deps.recorder.record(pod_ref(&pod), EventType::Warning, "FailedMount", message.clone());
                }
                // Volumes waiting for their attachment have no event of their own.
                if let Some(message) = e.timeout_event() {
                    self.deps.recorder.record(pod_ref(&pod), EventType::Warning, "FailedMount", message);
                }
                if !matches!(e, crate::volumes::Error::MountFailed { .. }) {
                    self.deps.recorder.record(pod_ref(&pod), EventType::Warning, "FailedMount", e.to_string());
                }
                return ERROR_REQUEUE;
            }
        }
        // A container's exit asked for all of them to restart in place: this sync removes
        // them, and the next one (at once) starts the pod again.
        let restart_all = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == crate::status::generate::ALL_CONTAINERS_RESTARTING && c.status == "True");
        let result = self.deps.runtime.sync_pod_restarting(&pod, &rt_status, restart_all).await;
        for e in result.errors() {
            tracing::debug!(pod = %name, error = %e, "sync error");
        }
        // Show the outcome at once rather than at the next PLEG event. A sync that left the
        // runtime alone may still have set a waiting reason (CrashLoopBackOff): the status
        // it started from serves, without asking the runtime again.
        if result.touched_runtime {
            self.last_change_started = Some(sync_started);
        }
        let fresh = if result.touched_runtime { self.deps.runtime.pod_status(self.uid()).await.ok() } else { None };
        let after = fresh.as_ref().unwrap_or(&rt_status);
        self.deps.runtime.allocation().check_resize_in_progress(&pod, after);
        self.update_status(&pod, after, false);
        if fresh.is_some() {
            // (rt_status's were noted above.)
            self.note_started(after);
        }
        self.last_sync_failed = result.failed();
        if restart_all && !result.failed() && result.removed_any() {
            return Duration::ZERO;
        }
        // A sidecar without a startup probe that just started lets the next init container
        // start: sync again at once (upstream's next sync comes from the PLEG's start
        // event, which this worker drops when its status already shows the start).
        if started_a_sidecar_without_startup_probe(&pod, &result) {
            return Duration::ZERO;
        }
        let resync = resync_after(self.deps.sync_frequency);
        // A failed sync comes back within upstream's `backOffPeriod` even when the back-off
        // it ran into is longer: a sync in back-off shows `ImagePullBackOff` or
        // `CrashLoopBackOff` (and its event) again, as upstream's requeue does.
        match result.requeue_after() {
            Some(r) if result.failed() => r.min(ERROR_REQUEUE).min(resync),
            Some(r) => r.min(resync),
            None if result.failed() => ERROR_REQUEUE.min(resync),
            None => resync,
        }
    }

    /// `SyncTerminatingPod`: stop containers (grace period) and sandboxes.
    async fn sync_terminating_pod(&mut self) -> bool {
        let rt_status = match self.deps.runtime.pod_status(self.uid()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot get pod status for termination");
                return false;
            }
        };
        if let Some(pod) = &self.pod {
            tracing::info!(pod = %pod_full_name(pod), grace = ?self.grace, "terminating pod");
            // Nothing must restart a container of a terminating pod (upstream
            // `StopLivenessAndStartup`); readiness keeps reporting.
            self.deps.runtime.probes().stop_liveness_and_startup(pod);
        }
        if let Err(e) = self.deps.runtime.kill_pod(self.pod.as_ref(), &rt_status, self.grace).await {
            tracing::warn!(error = %e, "failed to kill pod; retrying");
            if let Some(pod) = &self.pod {
                self.deps.recorder.record(
                    pod_ref(pod),
                    EventType::Warning,
                    "FailedKillPod",
                    format!("error killing pod: {e}"),
                );
            }
            return false;
        }
        self.deps.runtime.probes().remove_pod(self.uid());
        // Upstream: the claims are unprepared once the containers are stopped and before
        // the final status goes out (the scheduler may then give the devices away).
        if let (Some(dra), Some(pod)) = (self.deps.runtime.dra(), &self.pod)
            && let Err(e) = dra.unprepare_resources(pod).await
        {
            tracing::warn!(error = %e, "failed to unprepare dynamic resources; retrying");
            return false;
        }
        // Completed pods keep a final status; so do API pods being deleted, whose last
        // status (all containers terminated) is written before the object is removed.
        let report = self.desired || self.pod.as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_some());
        if let (Some(pod), true) = (self.pod.clone(), report)
            && let Ok(after) = self.deps.runtime.pod_status(self.uid()).await
        {
            self.update_status(&pod, &after, true);
        }
        true
    }

    /// `SyncTerminatedPod`: remove the pod cgroup; for pods that are gone, remove
    /// containers, sandboxes and directories too.
    async fn sync_terminated_pod(&mut self) -> bool {
        let cm = self.deps.cm.clone();
        let uid = self.uid.clone();
        let removed = tokio::task::spawn_blocking(move || cm.remove_pod_cgroup(&uid))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        if let Err(e) = removed {
            tracing::warn!(error = %e, "failed to remove the pod cgroup; retrying");
            return false;
        }
        // As upstream, the pod's user namespace range is free once its cgroup is gone.
        self.deps.runtime.userns().release(&self.uid);
        if self.desired {
            // A finished pod keeps its status and logs, not its volumes (upstream unmounts
            // them in SyncTerminatedPod).
            return self.clean_up_volumes().await;
        }
        let rt_status = match self.deps.runtime.pod_status(self.uid()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot get pod status for removal");
                return false;
            }
        };
        // A kill may race with a container that was being created: stop it again.
        if rt_status.is_running()
            && let Err(e) = self.deps.runtime.kill_pod(self.pod.as_ref(), &rt_status, Some(0)).await
        {
            tracing::warn!(error = %e, "failed to stop leftover containers");
            return false;
        }
        // Unmount before the pod directory is removed: removing it with a tmpfs still
        // mounted would fail, and must never reach into anything mounted there.
        if !self.clean_up_volumes().await {
            return false;
        }
        if let Err(e) = self.deps.runtime.remove_pod(&rt_status).await {
            tracing::warn!(error = %e, "failed to remove pod from the runtime; retrying");
            return false;
        }
        self.deps.status.remove(self.uid());
        true
    }

    /// Unmounts and removes the pod's volumes (blocking work, off the async workers).
    async fn clean_up_volumes(&self) -> bool {
        let volumes = self.deps.runtime.volumes().clone();
        let uid = self.uid.clone();
        let cleaned = tokio::task::spawn_blocking(move || volumes.cleanup_pod(&uid))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        if let Err(e) = cleaned {
            tracing::warn!(error = %e, "failed to clean up the pod's volumes; retrying");
            if let Some(pod) = &self.pod {
                self.deps.recorder.record(
                    pod_ref(pod),
                    EventType::Warning,
                    "FailedUnmount",
                    format!("UnmountVolume.TearDown failed: {e}"),
                );
            }
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::FakePodContainerManager;
    use crate::container::backoff::{Clock, SystemClock, TokioClock};
    use crate::container::fake::FakeRuntime;
    use crate::container::{Backoff, RuntimeService};
    use crate::events::MemoryRecorder;
    use crate::status::StatusManager;

    fn pod(uid: &str, name: &str, policy: &str, cmd_exit: bool) -> Pod {
        let _ = cmd_exit;
        static_pod(uid, name, serde_json::json!({"restartPolicy": policy, "containers": [ctr("c")]}))
    }

    /// A static pod on the host network with a 1 s grace period and `spec`'s fields.
    fn static_pod(uid: &str, name: &str, mut spec: serde_json::Value) -> Pod {
        spec["terminationGracePeriodSeconds"] = 1.into();
        spec["hostNetwork"] = true.into();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid,
                         "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": spec,
        }))
        .unwrap()
    }

    /// Container `name` of image `img`.
    fn ctr(name: &str) -> serde_json::Value {
        serde_json::json!({"name": name, "image": "img", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": ""})
    }

    fn work(p: Option<&Pod>, kind: WorkType, started: Option<&str>) -> Work {
        Work { pod: p.cloned(), kind, started: started.map(str::to_owned) }
    }

    /// The slot keeps one pod (the latest) and one kind (the strongest), however many
    /// updates are sent before the worker looks: upstream's single pending update.
    #[test]
    fn the_pending_slot_holds_one_merged_update() {
        let mailbox = Mailbox::default();
        for i in 0..1000 {
            let mut p = pod("u1", "a", "Always", false);
            p.metadata.resource_version = Some(i.to_string());
            mailbox.send(work(Some(&p), WorkType::Update, None)).unwrap();
        }
        mailbox.send(work(None, WorkType::Kill { grace: Some(3) }, None)).unwrap();
        mailbox.send(work(None, WorkType::Sync, Some("c1"))).unwrap();
        let p = mailbox.take().expect("pending");
        assert_eq!(p.pod.unwrap().metadata.resource_version.as_deref(), Some("999"));
        assert_eq!(p.kind, Some(WorkType::Kill { grace: Some(3) }));
        assert!(p.killed && !p.created_after_kill && p.other);
        assert_eq!(p.started, ["c1"]);
        assert!(mailbox.take().is_none(), "taken once");
        mailbox.close();
        assert!(mailbox.send(work(None, WorkType::Sync, None)).is_err(), "a closed slot gives the work back");
    }

    /// The order of a kill and a create sent between two looks is kept: kill then create
    /// restarts the pod once terminated; create then kill does not.
    #[test]
    fn the_pending_slot_keeps_the_order_of_kill_and_create() {
        let p = pod("u1", "a", "Always", false);
        let mut kill_create = Pending::default();
        kill_create.add(work(None, WorkType::Kill { grace: None }, None));
        kill_create.add(work(Some(&p), WorkType::Create, None));
        assert!(kill_create.killed && kill_create.created_after_kill);
        assert_eq!(kill_create.kind, Some(WorkType::Kill { grace: None }));
        let mut create_kill = Pending::default();
        create_kill.add(work(Some(&p), WorkType::Create, None));
        create_kill.add(work(None, WorkType::Kill { grace: None }, None));
        assert!(create_kill.killed && !create_kill.created_after_kill);
        // PLEG starts alone are not "other" news.
        let mut starts = Pending::default();
        starts.add(work(Some(&p), WorkType::Sync, Some("c1")));
        starts.add(work(Some(&p), WorkType::Sync, Some("c2")));
        assert!(!starts.other);
        assert_eq!(starts.started, ["c1", "c2"]);
    }

    struct Env {
        rt: Arc<FakeRuntime>,
        workers: PodWorkers,
        status: Arc<StatusManager>,
        recorder: Arc<MemoryRecorder>,
        metrics: Arc<PodWorkerMetrics>,
        _dir: tempfile::TempDir,
        stop: CancellationToken,
    }

    fn env() -> Env {
        env_with(Arc::new(SystemClock))
    }

    fn env_with(clock: Arc<dyn Clock>) -> Env {
        env_with_state(clock, None)
    }

    fn env_with_state(
        clock: Arc<dyn Clock>,
        runtime_state: Option<Arc<crate::container::runtime_state::RuntimeState>>,
    ) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let rt = Arc::new(FakeRuntime::with_images(&["img"]).with_clock(clock.clone()));
        let cm: Arc<dyn PodContainerManager> = Arc::new(FakePodContainerManager::default());
        let mut deps = crate::runtime::manager::RuntimeManagerDeps::fake(rt.clone(), dir.path());
        deps.cm = cm.clone();
        deps.cfg.node_name = "n".into();
        deps.backoff = Backoff::new(crate::container::backoff::INITIAL, crate::container::backoff::MAX, clock);
        let metrics = Arc::new(PodWorkerMetrics::default());
        let manager = RuntimeManager::new(deps);
        let status = Arc::new(StatusManager::default());
        let recorder = Arc::new(MemoryRecorder::new("n"));
        let deps = Arc::new(SyncDeps {
            runtime: Arc::new(manager),
            cm,
            status: status.clone(),
            metrics: metrics.clone(),
            recorder: recorder.clone(),
            runtime_name: "fake".into(),
            sync_frequency: Duration::from_mins(1),
            host_ip: None,
            runtime_state,
            records: crate::event_api::EventBus::default(),
        });
        let stop = CancellationToken::new();
        let workers = PodWorkers::new(deps, TaskTracker::new(), stop.clone());
        Env { rt, workers, status, recorder, metrics, _dir: dir, stop }
    }

    async fn wait_for<F: Fn() -> bool>(f: F) {
        for _ in 0..200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached");
    }

    /// What the sync loop does with a PLEG event before the worker hears of it: the pod's
    /// kept runtime status is stale from now on.
    fn pleg_event(e: &Env, uid: &str) {
        e.workers.deps.runtime.cache().invalidate(uid, tokio::time::Instant::now());
    }

    /// The state of the first container in pod `uid`'s status, if there is one.
    fn first_container_state(e: &Env, uid: &str) -> Option<k8s_openapi::api::core::v1::ContainerState> {
        e.status.get(uid)?.container_statuses?.into_iter().next()?.state
    }

    /// Creates pod `p` (`uid`) and waits until its status shows its first container running.
    async fn create_and_wait_running(e: &Env, p: &Pod, uid: &str) {
        e.workers.update_pod(p.clone(), WorkType::Create);
        while first_container_state(e, uid).is_none_or(|s| s.running.is_none()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What the evented PLEG and the sync loop do for an exit the kernel saw (container
    /// `id` of pod `uid` exited with `code`) that the runtime has not recorded.
    fn kernel_exit_event(e: &Env, uid: &str, id: &str, code: i32) {
        let cache = e.workers.deps.runtime.cache();
        cache.exits().record(uid, id, code, SystemTime::now());
        cache.exit_recorded(uid, tokio::time::Instant::now());
    }

    #[tokio::test]
    async fn create_then_kill_removes_everything() {
        let e = env();
        let p = pod("u1", "a", "Always", false);
        e.workers.update_pod(p.clone(), WorkType::Create);
        wait_for(|| e.status.get("u1").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        assert_eq!(e.rt.containers_named("c").len(), 1);
        e.workers.update_pod(p, WorkType::Kill { grace: None });
        tokio::time::timeout(Duration::from_secs(5), e.workers.wait_finished("u1")).await.unwrap();
        assert!(e.rt.containers_named("c").is_empty());
        assert!(e.rt.list_pod_sandbox(None).await.unwrap().is_empty());
        assert!(e.status.get("u1").is_none());
        e.stop.cancel();
    }

    /// An API pod held by a finalizer after its deletion: once its worker finished, its
    /// later updates start no worker that would write a status of a pod with nothing
    /// left (upstream ignores updates of a finished pod until it leaves its source).
    #[tokio::test]
    async fn a_deleted_api_pod_held_by_a_finalizer_keeps_its_final_status() {
        let e = env();
        let mut p = pod("u1", "a", "Always", false);
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(crate::types::pod::CONFIG_SOURCE_ANNOTATION.into(), "api".into());
        e.workers.update_pod(p.clone(), WorkType::Create);
        wait_for(|| e.status.get("u1").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
        e.workers.update_pod(p.clone(), WorkType::Kill { grace: Some(1) });
        tokio::time::timeout(Duration::from_secs(5), e.workers.wait_finished("u1")).await.unwrap();
        assert!(e.status.get("u1").is_none(), "the final status was handed to the status writer");
        // The API's update of the deleted object (grace 0, the finalizer still there).
        e.workers.update_pod(p.clone(), WorkType::Kill { grace: Some(0) });
        e.workers.update_pod(p.clone(), WorkType::Update);
        assert!(e.workers.known_uids().is_empty(), "no new worker");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(e.status.get("u1").is_none(), "no new status");
        // Once the object is gone from its source, a new pod of that UID would start again.
        assert!(e.workers.forget_finished("u1"));
        assert!(!e.workers.forget_finished("u1"));
        e.stop.cancel();
    }

    /// `activeDeadlineSeconds`: once the pod has been active that long it is stopped and
    /// kept `Failed` with reason `DeadlineExceeded`, without any other sync asking.
    #[tokio::test]
    async fn a_pod_past_its_active_deadline_is_stopped_and_failed() {
        let e = env();
        let mut p = pod("u1", "a", "Always", false);
        p.spec.as_mut().unwrap().active_deadline_seconds = Some(1);
        e.workers.update_pod(p.clone(), WorkType::Create);
        wait_for(|| e.status.get("u1").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        wait_for(|| e.status.get("u1").is_some_and(|s| s.phase.as_deref() == Some("Failed"))).await;
        let s = e.status.get("u1").unwrap();
        assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
        assert_eq!(s.message.as_deref(), Some("Pod was active on the node longer than the specified deadline"));
        let id = e.rt.containers_named("c")[0].clone();
        for _ in 0..200 {
            let state = e.rt.container_status(&id).await.map(|c| c.state).unwrap_or_default();
            if state == crate::container::api::ContainerState::ContainerExited as i32 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let state = e.rt.container_status(&id).await.unwrap().state;
        assert_eq!(state, crate::container::api::ContainerState::ContainerExited as i32, "stopped");
        let event = e.recorder.list().into_iter().find(|ev| ev.reason.as_deref() == Some("DeadlineExceeded")).unwrap();
        assert_eq!(event.type_.as_deref(), Some("Normal"));
        e.stop.cancel();
    }

    /// Found by the conformance suite: after a sidecar without a startup probe started,
    /// the next init container waited for the periodic resync (a minute). It starts in
    /// the sync that follows at once, with no event from outside.
    #[tokio::test]
    async fn the_init_container_after_a_sidecar_starts_without_waiting_for_a_resync() {
        let e = env();
        let mut sidecar = ctr("s");
        sidecar["restartPolicy"] = "Always".into();
        let p =
            static_pod("u1", "a", serde_json::json!({"initContainers": [sidecar, ctr("i")], "containers": [ctr("c")]}));
        e.workers.update_pod(p, WorkType::Create);
        wait_for(|| e.rt.containers_named("i").len() == 1).await;
        assert_eq!(e.rt.containers_named("s").len(), 1);
        e.stop.cancel();
    }

    /// `RestartAllContainers`: an exit code with that rule removes every container of
    /// the pod (the running one stopped first) and, in the sync that
    /// follows at once, starts them again; each counts one restart.
    #[tokio::test]
    async fn an_exit_with_a_restart_all_rule_restarts_every_container() {
        let e = env();
        let mut c = ctr("c");
        c["restartPolicy"] = "Never".into();
        c["restartPolicyRules"] =
            serde_json::json!([{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]);
        let p = static_pod("u1", "a", serde_json::json!({"restartPolicy": "Never", "containers": [c, ctr("d")]}));
        e.workers.update_pod(p.clone(), WorkType::Create);
        wait_for(|| e.status.get("u1").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        let (c0, d0) = (e.rt.containers_named("c")[0].clone(), e.rt.containers_named("d")[0].clone());
        e.rt.exit_container(&c0, 42);
        pleg_event(&e, "u1");
        e.workers.update_pod(p.clone(), WorkType::Sync);
        let restarted = |name: &str, old: &str| {
            let ids = e.rt.containers_named(name);
            ids.len() == 1 && ids[0] != old
        };
        wait_for(|| restarted("c", &c0) && restarted("d", &d0)).await;
        wait_for(|| {
            e.status.get("u1").is_some_and(|s| {
                s.container_statuses
                    .iter()
                    .flatten()
                    .all(|c| c.restart_count == 1 && c.state.as_ref().is_some_and(|st| st.running.is_some()))
            })
        })
        .await;
        let s = e.status.get("u1").unwrap();
        assert_eq!(s.phase.as_deref(), Some("Running"));
        let cond = s.conditions.iter().flatten().find(|c| c.type_ == "AllContainersRestarting").unwrap();
        assert_eq!(cond.status, "False");
        assert_eq!(e.rt.stopped_containers(), ["d"], "only the running container is stopped");
        e.stop.cancel();
    }

    #[tokio::test]
    async fn each_computed_status_is_a_record_on_the_event_bus() {
        let e = env();
        let mut records = e.workers.records().subscribe();
        e.workers.update_pod(pod("u-rec", "rec", "Always", false), WorkType::Create);
        wait_for(|| e.status.get("u-rec").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        let mut running = None;
        while running.is_none() {
            let ev = tokio::time::timeout(Duration::from_secs(5), records.recv()).await.unwrap().unwrap();
            assert_eq!(ev.kind, crate::event_api::NodeEventKind::PodStatusComputed);
            assert_eq!((ev.pod_uid.as_str(), ev.pod_name.as_str()), ("u-rec", "rec"));
            assert!(ev.agent_time_ns.is_some_and(|t| t > 0));
            running = ev.containers.iter().find(|c| c.name == "c" && c.state == "running").cloned();
        }
        assert_eq!(running.unwrap().restart_count, 0);
        e.stop.cancel();
    }

    #[tokio::test]
    async fn only_host_network_pods_start_while_the_pod_network_is_not_ready() {
        use crate::container::api;
        use crate::container::runtime_state::RuntimeState;
        let state = Arc::new(RuntimeState::default());
        let e = env_with_state(Arc::new(SystemClock), Some(state.clone()));
        let ready = |network: bool| api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: ["RuntimeReady", "NetworkReady"]
                    .iter()
                    .map(|t| api::RuntimeCondition {
                        r#type: (*t).into(),
                        status: *t == "RuntimeReady" || network,
                        reason: "NetworkPluginNotReady".into(),
                        message: "cni plugin not initialized".into(),
                    })
                    .collect(),
            }),
            ..Default::default()
        };
        state.apply(Ok(&ready(false)));
        // (The helper's pods are on the host's network.)
        let mut net = pod("u-net", "net", "Always", false);
        net.spec.as_mut().unwrap().host_network = None;
        e.workers.update_pod(pod("u-host", "host", "Always", false), WorkType::Create);
        e.workers.update_pod(net.clone(), WorkType::Create);
        wait_for(|| e.status.get("u-host").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        wait_for(|| e.recorder.list().iter().any(|ev| ev.reason.as_deref() == Some("NetworkNotReady"))).await;
        let event = e.recorder.list().into_iter().find(|ev| ev.reason.as_deref() == Some("NetworkNotReady")).unwrap();
        assert_eq!(
            event.message.as_deref(),
            Some(
                "network is not ready: container runtime network not ready: NetworkReady=false \
                 reason:NetworkPluginNotReady message:cni plugin not initialized"
            )
        );
        assert!(e.rt.list_pod_sandbox(None).await.unwrap().len() == 1, "only the host-network pod's sandbox");
        // The network comes up: the other pod starts at its next sync (its retry, here
        // a resync at once rather than in 10 s).
        state.apply(Ok(&ready(true)));
        e.workers.update_pod(net, WorkType::Sync);
        wait_for(|| e.status.get("u-net").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        e.stop.cancel();
    }

    #[tokio::test]
    async fn completed_pod_stays_terminal_with_status() {
        let e = env();
        let p = pod("u2", "b", "Never", true);
        e.workers.update_pod(p.clone(), WorkType::Create);
        wait_for(|| !e.rt.containers_named("c").is_empty()).await;
        let id = e.rt.containers_named("c")[0].clone();
        e.rt.exit_container(&id, 0);
        pleg_event(&e, "u2");
        e.workers.update_pod(p.clone(), WorkType::Sync);
        wait_for(|| e.workers.states().get("u2") == Some(&WorkerState::Terminated)).await;
        assert_eq!(e.status.get("u2").unwrap().phase.as_deref(), Some("Succeeded"));
        // Not restarted, sandbox stopped.
        assert_eq!(e.rt.containers_named("c").len(), 1);
        let sb = e.rt.list_pod_sandbox(None).await.unwrap();
        assert!(sb.iter().all(|s| s.state != crate::container::api::PodSandboxState::SandboxReady as i32));
        e.stop.cancel();
    }

    #[tokio::test]
    async fn edited_static_pod_waits_for_previous_instance() {
        let e = env();
        let old = pod("old", "same", "Always", false);
        e.workers.update_pod(old.clone(), WorkType::Create);
        wait_for(|| e.rt.containers_named("c").len() == 1).await;
        e.workers.update_pod(old, WorkType::Kill { grace: None });
        e.workers.update_pod(pod("new", "same", "Always", false), WorkType::Create);
        tokio::time::timeout(Duration::from_secs(5), e.workers.wait_finished("old")).await.unwrap();
        wait_for(|| e.status.get("new").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        let calls = e.rt.calls();
        let last_remove = calls.iter().rposition(|c| c == "remove_podsandbox").unwrap();
        let last_run = calls.iter().rposition(|c| c == "run_podsandbox").unwrap();
        assert!(last_remove < last_run, "new instance started before old one was removed: {calls:?}");
        e.stop.cancel();
    }

    /// A static pod removed and added again (same content, so the same UID) while its
    /// worker still terminates it is restarted once that termination is done (upstream
    /// `restartRequested`), and `kubelet_restarted_pods` counts it.
    #[tokio::test]
    async fn a_static_pod_re_added_while_terminating_is_restarted() {
        let e = env();
        let p = pod("u6", "again", "Always", false);
        e.workers.update_pod(p.clone(), WorkType::Create);
        wait_for(|| e.status.get("u6").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        let first = e.rt.containers_named("c");
        e.workers.update_pod(p.clone(), WorkType::Kill { grace: None });
        e.workers.update_pod(p, WorkType::Create);
        let running_again = || {
            e.workers.states().get("u6") == Some(&WorkerState::Syncing)
                && e.status.get("u6").is_some_and(|s| s.phase.as_deref() == Some("Running"))
                && e.rt.containers_named("c").iter().any(|c| !first.contains(c))
        };
        wait_for(running_again).await;
        assert_eq!(e.rt.containers_named("c").len(), 1, "the old instance was removed: {:?}", e.rt.calls());
        let restarted = |s: &str| {
            e.metrics.restarted_pods.get_or_create(&crate::metrics::StaticLabels { r#static: s.into() }).get()
        };
        assert_eq!((restarted("true"), restarted("false")), (1, 0));
        e.stop.cancel();
    }

    /// Housekeeping's claim on a UID is refused while the UID has a worker, and a worker
    /// started while the claim is held does nothing until it is released.
    #[tokio::test(start_paused = true)]
    async fn a_worker_waits_for_housekeeping_to_release_its_uid() {
        let e = env_with(Arc::new(TokioClock::new()));
        let claim = e.workers.claim_for_cleanup("u7").expect("no worker yet");
        assert!(e.workers.claim_for_cleanup("u7").is_none(), "one claim at a time");
        let p = pod("u7", "claimed", "Always", false);
        e.workers.update_pod(p, WorkType::Create);
        assert!(e.workers.claim_for_cleanup("u7").is_none(), "the UID has a worker");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(e.rt.calls().is_empty(), "the worker ran while its UID was claimed: {:?}", e.rt.calls());
        drop(claim);
        while e.status.get("u7").is_none_or(|s| s.phase.as_deref() != Some("Running")) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        e.stop.cancel();
    }

    /// A pod without a spec (a source that sent a broken object) is an error for that
    /// pod: an event and nothing started, never a panic; the runtime manager refuses to
    /// sync it, and the worker still terminates it when it is removed.
    #[tokio::test]
    async fn a_pod_without_a_spec_is_an_error_for_that_pod() {
        let e = env();
        let mut p = pod("u8", "nospec", "Always", false);
        p.spec = None;
        let rt_status = e.workers.deps.runtime.pod_status("u8").await.unwrap();
        let result = e.workers.deps.runtime.sync_pod(&p, &rt_status).await;
        assert_eq!(result.errors(), vec!["pod nospec_default(u8) has no spec".to_string()]);
        e.workers.update_pod(p.clone(), WorkType::Create);
        wait_for(|| e.recorder.list().iter().any(|ev| ev.reason.as_deref() == Some("FailedSync"))).await;
        assert!(e.rt.list_pod_sandbox(None).await.unwrap().is_empty(), "nothing started");
        e.workers.update_pod(p, WorkType::Kill { grace: None });
        tokio::time::timeout(Duration::from_secs(5), e.workers.wait_finished("u8")).await.unwrap();
        e.stop.cancel();
    }

    /// Shutdown stops a worker at once, even in the middle of a runtime call (here a
    /// sandbox start that never returns): the agent's exit waits for nothing a pod does,
    /// and the pod is left as it is.
    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_a_worker_in_the_middle_of_a_sync() {
        let e = env_with(Arc::new(TokioClock::new()));
        let entered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = entered.clone();
        e.rt.set_start_hook(move |_| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Box::pin(std::future::pending())
        });
        e.workers.update_pod(pod("u9", "stuck", "Always", false), WorkType::Create);
        for _ in 0..1000 {
            if entered.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(entered.load(std::sync::atomic::Ordering::SeqCst), "the sandbox start was never called");
        e.stop.cancel();
        e.workers.tracker.close();
        tokio::time::timeout(Duration::from_millis(100), e.workers.tracker.wait())
            .await
            .expect("the worker did not stop at shutdown");
    }

    /// A sync that only waits out the crash-loop back-off shows `CrashLoopBackOff` at once,
    /// from the status it started with: the runtime is read once, not again after it.
    #[tokio::test(start_paused = true)]
    async fn a_back_off_sync_reports_its_reason_without_reading_the_runtime_again() {
        let e = env_with(Arc::new(TokioClock::new()));
        let p = pod("u4", "crash", "Always", false);
        e.workers.update_pod(p.clone(), WorkType::Create);
        let reads = || e.rt.calls().iter().filter(|c| *c == "list_podsandbox").count();
        let container = |restarts: i32| {
            e.status
                .get("u4")
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next())
                .filter(|c| c.restart_count == restarts && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        };
        // The first crash restarts at once; wait until that sync has shown the restart.
        while container(0).is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        e.rt.exit_container(&e.rt.containers_named("c")[0], 1);
        pleg_event(&e, "u4");
        e.workers.update_pod(p.clone(), WorkType::Sync);
        while container(1).is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let before = reads();
        e.rt.exit_container(&e.rt.containers_named("c").last().cloned().unwrap(), 1);
        pleg_event(&e, "u4");
        e.workers.update_pod(p.clone(), WorkType::Sync);
        let waiting = |s: &k8s_openapi::api::core::v1::PodStatus| {
            s.container_statuses.as_ref()?[0].state.as_ref()?.waiting.as_ref()?.reason.clone()
        };
        while e.status.get("u4").and_then(|s| waiting(&s)).as_deref() != Some("CrashLoopBackOff") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(e.rt.created_containers(), 2, "still backing off");
        assert_eq!(reads() - before, 1, "one runtime read for the back-off sync");
        e.stop.cancel();
    }

    /// A PLEG start of a sandbox or container that the pod's status already shows
    /// started is no reason to sync (the worker read the runtime after starting them);
    /// a start it has not seen, or any other event, is. In paused time a sleep returns
    /// once every task is idle: the worker has handled what it was sent.
    #[tokio::test(start_paused = true)]
    async fn a_pleg_start_the_status_already_shows_brings_no_sync() {
        let e = env_with(Arc::new(TokioClock::new()));
        let p = pod("u5", "quiet", "Always", false);
        e.workers.update_pod(p.clone(), WorkType::Create);
        while e.status.get("u5").is_none_or(|s| s.phase.as_deref() != Some("Running")) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let idle = || tokio::time::sleep(Duration::from_secs(1));
        idle().await;
        let reads = || e.rt.calls().iter().filter(|c| *c == "list_podsandbox").count();
        let sandbox = e.rt.list_pod_sandbox(None).await.unwrap()[0].id.clone();
        let container = e.rt.containers_named("c")[0].clone();
        let before = reads();
        for id in [&sandbox, &container] {
            e.workers.container_started(p.clone(), id.clone());
            idle().await;
        }
        assert_eq!(reads(), before, "both starts were in the status already");
        // A start the worker has not seen: a sync.
        pleg_event(&e, "u5");
        e.workers.container_started(p.clone(), "another".into());
        idle().await;
        assert_eq!(reads(), before + 1);
        // An exit: a sync, which restarts the container.
        e.rt.exit_container(&container, 1);
        pleg_event(&e, "u5");
        e.workers.update_pod(p.clone(), WorkType::Sync);
        idle().await;
        assert_eq!(reads(), before + 3, "a sync, with a read after its restart");
        assert_eq!(e.rt.containers_named("c").len(), 2);
        // The restarted container's start, seen in that read: no news either.
        let restarted = e.rt.containers_named("c").into_iter().find(|c| *c != container).unwrap();
        e.workers.container_started(p, restarted);
        idle().await;
        assert_eq!(reads(), before + 3);
        e.stop.cancel();
    }

    /// A sync soon after another, with no change in the pod since its last runtime read,
    /// uses the kept status (upstream's `GetNewerThan`); after a PLEG event, or once the
    /// kept status is older than [`MAX_KEPT_STATUS_AGE`], it reads the runtime.
    #[tokio::test(start_paused = true)]
    async fn a_sync_with_no_change_since_the_last_read_uses_the_kept_status() {
        let e = env_with(Arc::new(TokioClock::new()));
        let p = pod("u6", "kept", "Always", false);
        e.workers.update_pod(p.clone(), WorkType::Create);
        while e.status.get("u6").is_none_or(|s| s.phase.as_deref() != Some("Running")) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let idle = || tokio::time::sleep(Duration::from_millis(100));
        idle().await;
        let reads = || e.rt.calls().iter().filter(|c| *c == "list_podsandbox").count();
        let before = reads();
        e.workers.update_pod(p.clone(), WorkType::Sync);
        idle().await;
        assert_eq!(reads(), before, "nothing changed since the last read");
        pleg_event(&e, "u6");
        e.workers.update_pod(p.clone(), WorkType::Sync);
        idle().await;
        assert_eq!(reads(), before + 1, "a change came after the last read");
        tokio::time::sleep(MAX_KEPT_STATUS_AGE).await;
        e.workers.update_pod(p, WorkType::Sync);
        idle().await;
        assert_eq!(reads(), before + 2, "the kept status is too old");
        e.stop.cancel();
    }

    /// An exit the kernel saw, in a pod whose kept runtime status is too old to sync from:
    /// the pod's status shows it while the runtime has not answered yet, and once the
    /// runtime answers the sync restarts the container.
    #[tokio::test(start_paused = true)]
    async fn a_kernel_exit_reaches_the_status_before_the_runtime_answers() {
        let e = env_with(Arc::new(TokioClock::new()));
        let p = pod("u7", "exit", "Always", false);
        create_and_wait_running(&e, &p, "u7").await;
        let state = || first_container_state(&e, "u7");
        tokio::time::sleep(MAX_KEPT_STATUS_AGE * 2).await;
        let gate = Arc::new(tokio::sync::Notify::new());
        let opened = gate.clone();
        e.rt.set_list_hook(move |_| {
            let gate = opened.clone();
            Box::pin(async move { gate.notified().await })
        });
        let container = e.rt.containers_named("c")[0].clone();
        kernel_exit_event(&e, "u7", &container, 137);
        e.workers.update_pod(p, WorkType::Sync);
        let terminated = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(t) = state().and_then(|s| s.terminated) {
                    return t;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the exit waited for the runtime");
        assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (137, Some("Error")));
        assert_eq!(e.rt.containers_named("c").len(), 1, "no restart before the runtime answered");
        e.rt.set_list_hook(|_| Box::pin(async {}));
        gate.notify_waiters();
        while e.rt.containers_named("c").len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        e.stop.cancel();
    }

    /// An admission's allocation is written before the pod's sandbox is started, by the
    /// pod's worker (admission does not write it).
    #[tokio::test]
    async fn the_allocation_is_written_before_the_pod_runs() {
        let e = env();
        let p = pod("u10", "alloc", "Always", false);
        let allocation = e.workers.deps.runtime.allocation().clone();
        allocation.add_pod(&p);
        assert!(allocation.has_unwritten(), "admission leaves the write to the worker");
        let unwritten_at_start = Arc::new(Mutex::new(Vec::new()));
        let seen = unwritten_at_start.clone();
        let checked = allocation.clone();
        e.rt.set_start_hook(move |call| {
            seen.lock().unwrap().push((call, checked.has_unwritten()));
            Box::pin(async {})
        });
        e.workers.update_pod(p, WorkType::Create);
        wait_for(|| e.status.get("u10").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
        let seen = unwritten_at_start.lock().unwrap().clone();
        assert_eq!(seen.first(), Some(&("run_podsandbox", false)), "{seen:?}");
        e.stop.cancel();
    }

    /// Found by the end-to-end containerd restart test: an exit the kernel saw while the
    /// runtime is away, soon after the pod's last sync (its kept status young), is written
    /// into the status, but the restart waits for the runtime's answer — a start tried
    /// while the runtime is away would fail and count towards the crash-loop back-off —
    /// and happens at once when the runtime is back.
    #[tokio::test(start_paused = true)]
    async fn a_kernel_exit_while_the_runtime_is_away_restarts_once_it_is_back() {
        let e = env_with(Arc::new(TokioClock::new()));
        let p = pod("u11", "away", "Always", false);
        create_and_wait_running(&e, &p, "u11").await;
        let state = || first_container_state(&e, "u11");
        let creates = || e.rt.calls().iter().filter(|c| *c == "create_container").count();
        let before = creates();
        e.rt.set_unavailable(true);
        let container = e.rt.containers_named("c")[0].clone();
        kernel_exit_event(&e, "u11", &container, 137);
        e.workers.update_pod(p.clone(), WorkType::Sync);
        wait_for(|| state().is_some_and(|s| s.terminated.is_some())).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(creates(), before, "no start while the runtime is away");
        // The runtime back: the PLEG passes the exit on again.
        e.rt.set_unavailable(false);
        let back = tokio::time::Instant::now();
        e.workers.deps.runtime.cache().exit_recorded("u11", back);
        e.workers.update_pod(p, WorkType::Sync);
        while creates() == before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(back.elapsed() < Duration::from_secs(1), "restarted {:?} after the runtime came back", back.elapsed());
        assert!(
            !e.recorder.list().iter().any(|ev| ev.reason.as_deref() == Some("BackOff")),
            "no back-off from a start the runtime never saw"
        );
        e.stop.cancel();
    }

    /// The crash-loop schedule in (paused) time: restarts after 0, 10, 20, 40 and 80 s.
    #[tokio::test(start_paused = true)]
    async fn crash_loop_restarts_wait_for_the_growing_backoff() {
        let e = env_with(Arc::new(TokioClock::new()));
        let p = pod("u3", "crash", "Always", false);
        e.workers.update_pod(p.clone(), WorkType::Create);
        let mut starts = Vec::new();
        for n in 1..=6 {
            while e.rt.created_containers() < n {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            starts.push(tokio::time::Instant::now());
            // The container crashes at once; the PLEG would report it.
            let newest = e.rt.containers_named("c").last().cloned().unwrap();
            e.rt.exit_container(&newest, 1);
            pleg_event(&e, "u3");
            e.workers.update_pod(p.clone(), WorkType::Sync);
        }
        let gaps: Vec<u64> = starts.windows(2).map(|w| (w[1] - w[0]).as_secs_f64().round() as u64).collect();
        assert_eq!(gaps, vec![0, 10, 20, 40, 80]);
        let status = e.status.get("u3").unwrap();
        let c = &status.container_statuses.unwrap()[0];
        assert_eq!(c.restart_count, 5);
        e.stop.cancel();
    }

    /// Found by `cargo xtask fidelity` against the upstream kubelet: after a failed pull the
    /// next PLEG event of the pod (its sandbox's start) syncs it again, and the status
    /// shows `ImagePullBackOff` with the pull's error, as upstream, instead of
    /// `ErrImagePull` until the back-off ran out; and the failed sync comes back within
    /// 10 s (upstream's requeue), not at the end of a longer back-off.
    #[tokio::test(start_paused = true)]
    async fn a_failed_pull_is_followed_by_its_back_off_in_the_status() {
        let e = env_with(Arc::new(TokioClock::new()));
        e.rt.set_pull_hook(|image, _| {
            let image = image.to_owned();
            Box::pin(async move {
                Err(crate::container::Error::Rpc {
                    operation: "pull_image",
                    status: tonic::Status::not_found(format!("{image}: not found")),
                })
            })
        });
        let mut p = pod("u5", "pull", "Always", false);
        p.spec.as_mut().unwrap().containers[0].image = Some("absent:1".into());
        p.spec.as_mut().unwrap().containers[0].image_pull_policy = Some("Always".into());
        let waiting = || {
            first_container_state(&e, "u5")
                .and_then(|s| s.waiting)
                .map(|w| (w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
        };
        e.workers.update_pod(p.clone(), WorkType::Create);
        while waiting().is_none_or(|(r, _)| r != "ErrImagePull") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pulls = || e.rt.calls().iter().filter(|c| *c == "pull_image").count();
        assert_eq!(pulls(), 1);
        // The sandbox's start, as the PLEG reports it: the agent's own start (no news
        // after a sync that went well), but the last sync failed.
        let id = crate::container::RuntimeService::list_pod_sandbox(e.rt.as_ref(), None).await.unwrap()[0].id.clone();
        e.workers.container_started(p.clone(), id);
        let sent = tokio::time::Instant::now();
        while waiting().is_none_or(|(r, _)| r != "ImagePullBackOff") && sent.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (reason, message) = waiting().unwrap();
        assert_eq!(reason, "ImagePullBackOff", "the PLEG event synced the pod at once");
        assert_eq!(
            message,
            "Back-off pulling image \"absent:1\": ErrImagePull: rpc error: code = NotFound desc = absent:1: not found"
        );
        assert_eq!(pulls(), 1, "no pull while in back-off");
        e.stop.cancel();
    }
}
