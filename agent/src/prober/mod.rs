//! Container probing (upstream `pkg/kubelet/prober`, without the concrete handlers).
//!
//! [`ProbeManager::add_pod`] starts one worker task per (container, probe type) for the
//! `startupProbe`, `readinessProbe` and `livenessProbe` of every regular container and
//! of every restartable init container (sidecar, `restartPolicy: Always`). A worker:
//!
//! - waits a random part of `periodSeconds` before its first probe when the agent
//!   itself started less than one period ago (so that probes of pods found at start-up
//!   do not all fire at once), then wakes every `periodSeconds` (missed ticks are
//!   skipped, as Go's `time.Ticker` does);
//! - reads the latest pod status the agent fed through [`ProbeManager::set_pod_status`]
//!   (upstream reads the status manager): no status yet, or no container id yet, means
//!   "wait"; a terminal phase (`Succeeded`/`Failed`) ends the worker;
//! - on a new container id drops the result of the old one, publishes the initial
//!   value (readiness `Failure`, liveness `Success`, startup `Unknown`) and leaves the
//!   "on hold" state;
//! - does not probe a non-running container: its result becomes `Failure` and the
//!   worker ends if the container terminated and will not be restarted (not a
//!   sidecar, its restart policy and rules do not restart it after that exit code, and
//!   no exit of the pod asks for all its containers to restart);
//! - on a pod with a `deletionTimestamp` publishes `Success` for liveness and startup
//!   and ends (readiness keeps going);
//! - does not probe before `initialDelaySeconds` have passed since the container's
//!   `startedAt`; runs the startup probe only until the container has started, and the
//!   liveness and readiness probes only once it has;
//! - runs the probe through the [`ProbeRunner`] (an error is retried up to three times
//!   and then thrown away), records the `Unhealthy` / `ProbeWarning` event and the
//!   `/metrics/probes` samples, and publishes a result only once `successThreshold` /
//!   `failureThreshold` equal results came in a row;
//! - after publishing a liveness `Failure`, or any startup result, stays on hold until
//!   the container id changes (the container is being restarted, or has started).
//!
//! Published results live in three [`ResultsCache`]s keyed by container id. Every
//! *change* is also sent as a [`ProbeUpdate`] on the stream from
//! [`ProbeManager::take_updates`]. The agent's sync loop reacts as upstream's does:
//!
//! - liveness `Failure`: sync the pod; the runtime kills the container (see
//!   [`ProbeManager::container_to_kill`] for upstream's message and grace period) and
//!   restarts it according to the restart policy;
//! - readiness change: update the container's readiness in the status and sync;
//! - startup change: update the container's `started` in the status and sync (a
//!   `Failure` kills the container like a liveness failure).
//!
//! What the agent calls, and when:
//!
//! - [`ProbeManager::add_pod`] on every sync of a running pod (upstream `SyncPod`);
//! - [`ProbeManager::set_pod_status`] whenever it has a new status for the pod
//!   (upstream: the status manager); workers probe nothing until it has;
//! - [`ProbeManager::update_pod_status`] while generating a status, to set `ready` and
//!   `started` of every container status (upstream `generateAPIPodStatus`);
//! - [`ProbeManager::container_to_kill`] for each running container while computing
//!   the pod's actions (upstream `computePodActions`);
//! - [`ProbeManager::stop_liveness_and_startup`] when the pod starts terminating
//!   (upstream `SyncTerminatingPod`); do not call `add_pod` for it afterwards;
//! - [`ProbeManager::remove_pod`] when the pod is removed (upstream `HandlePodRemoves`), and
//!   [`ProbeManager::cleanup_pods`] with the pods that may still run
//!   (upstream `HandlePodCleanups`);
//! - [`ProbeManager::take_updates`] once, in the sync loop;
//! - [`ProberMetrics::registry`] served at `/metrics/probes`.
//!
//! Deviations from upstream:
//! - Workers decide whether a container has started from the startup results directly
//!   (what `update_pod_status` would write) instead of the `started` field of the fed
//!   status, so the agent need not round-trip every status before probes can run.
//! - A new container id also resets the run of equal results, so a restarted container
//!   always needs the full thresholds (upstream only resets it after a liveness or
//!   startup verdict).
//! - `add_pod` skips the (container, probe type) pairs that already have a worker and
//!   adds the others; upstream stops at the first existing worker.
//! - Stopping a worker (`remove_pod`, ...) also abandons a probe in flight.
//! - The update stream is unbounded; upstream blocks probing when its 20-slot channel
//!   is full.
//! - Probe fields the API server would default (period 10 s, timeout 1 s, thresholds
//!   1 and 3) are defaulted here too, for static pods; the runner sees the defaulted
//!   probe.
//! - Not implemented: the kubelet-restart grace (newer upstream keeps a container that
//!   was running before the kubelet restarted ready until its probe says otherwise,
//!   feature `ChangeContainerStatusOnKubeletRestart`), and the container restart rules
//!   of feature `ContainerRestartRules`.

pub mod metrics;
mod probe;
mod results;
pub mod runner;
mod worker;

#[cfg(test)]
mod tests;

use crate::types::pod::uid as pod_uid;
use crate::types::pod_resources::is_restartable_init_container;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus, Probe};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::events::EventRecorder;

pub use metrics::ProberMetrics;
pub use probe::{REASON_PROBE_WARNING, REASON_UNHEALTHY};
pub use results::ResultsCache;

/// The kind of probe. `Display` gives upstream's names (`Liveness`, ...), which are
/// also the `probe_type` label values and the prefix of the event messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeType {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeType {
    /// Upstream's name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        }
    }

    /// The result a container has before its first verdict (upstream `initialValue`).
    #[must_use]
    pub fn initial_result(self) -> ProbeResult {
        match self {
            Self::Liveness => ProbeResult::Success,
            Self::Readiness => ProbeResult::Failure,
            Self::Startup => ProbeResult::Unknown,
        }
    }

    /// The container's probe of this type.
    #[must_use]
    pub fn probe_of(self, container: &Container) -> Option<&Probe> {
        match self {
            Self::Liveness => container.liveness_probe.as_ref(),
            Self::Readiness => container.readiness_probe.as_ref(),
            Self::Startup => container.startup_probe.as_ref(),
        }
    }
}

impl fmt::Display for ProbeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of one probe run, and of the cached verdicts. `Warning` counts as a
/// success (and is cached as `Success`); `Unknown` from a runner counts as a failure;
/// `Unknown` in a cache is the startup probe's initial value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    Success,
    Warning,
    Failure,
    Unknown,
}

impl ProbeResult {
    /// The variant's name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "Success",
            Self::Warning => "Warning",
            Self::Failure => "Failure",
            Self::Unknown => "Unknown",
        }
    }
}

/// What a [`ProbeRunner`] returns for one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub result: ProbeResult,
    /// The handler's output (exec output, HTTP body or error text, ...), used in the
    /// event message.
    pub output: String,
    /// Set when the probe could not be run at all (upstream: the handler returned an
    /// error). The run is retried up to three times; if it still errors, an
    /// `Unhealthy` event `<type> probe errored and resulted in <result> state: <error>`
    /// is recorded and the run does not count; `result` is then only the one the
    /// error came with (mostly `Unknown`) and `output` is ignored.
    pub error: Option<String>,
}

impl ProbeOutcome {
    #[must_use]
    pub fn success(output: impl Into<String>) -> Self {
        Self { result: ProbeResult::Success, output: output.into(), error: None }
    }

    #[must_use]
    pub fn warning(output: impl Into<String>) -> Self {
        Self { result: ProbeResult::Warning, output: output.into(), error: None }
    }

    #[must_use]
    pub fn failure(output: impl Into<String>) -> Self {
        Self { result: ProbeResult::Failure, output: output.into(), error: None }
    }

    #[must_use]
    pub fn unknown(output: impl Into<String>) -> Self {
        Self { result: ProbeResult::Unknown, output: output.into(), error: None }
    }

    /// An error that came with result `Unknown`.
    #[must_use]
    pub fn error(error: impl Into<String>) -> Self {
        Self::errored(ProbeResult::Unknown, error)
    }

    /// An error that came with `result` (upstream's `(result, output, err)` with a
    /// non-nil `err`).
    #[must_use]
    pub fn errored(result: ProbeResult, error: impl Into<String>) -> Self {
        Self { result, output: String::new(), error: Some(error.into()) }
    }
}

/// Runs one probe: the exec / HTTP / TCP / gRPC handlers plug in here.
#[async_trait::async_trait]
pub trait ProbeRunner: Send + Sync + 'static {
    /// Runs the `probe` of type `probe_type` of `container` in `pod`, whose latest
    /// status is `status` (pod IP for HTTP/TCP/gRPC). `container_id` is the runtime's
    /// id without the `<runtime>://` prefix (what CRI `ExecSync` takes). `probe` has the
    /// API defaults applied, so `probe.timeout_seconds` is always set: the runner must
    /// give up after that long.
    async fn run(
        &self,
        probe_type: ProbeType,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
        probe: &Probe,
    ) -> ProbeOutcome;
}

/// A change of a cached result, for the sync loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub pod_uid: String,
    pub container_name: String,
    /// As in the container status (`containerd://<id>`).
    pub container_id: String,
    pub probe_type: ProbeType,
    /// `Success`, `Failure` or (startup only) `Unknown`.
    pub result: ProbeResult,
    /// The probe's own `terminationGracePeriodSeconds` (liveness and startup only):
    /// when set, the grace period for killing the container after a failure. See
    /// [`probe_kill_grace_period`] for the whole rule.
    pub termination_grace_period_seconds: Option<i64>,
}

/// Why and how the runtime should kill a container because of its probes (upstream
/// `computePodActions` / `computeInitContainerActions` + `setTerminationGracePeriod`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeKill {
    /// `Liveness` or `Startup`.
    pub probe_type: ProbeType,
    /// The `Killing` event message, e.g. `Container web failed liveness probe, will be
    /// restarted`.
    pub message: String,
    /// Grace period for the stop, in seconds, before the runtime's minimum.
    pub grace_period_seconds: i64,
    /// Whether the container will be started again afterwards.
    pub restart: bool,
}

/// Upstream `setTerminationGracePeriod` for a kill after a failed `probe_type` probe:
/// the pod's `deletionGracePeriodSeconds` if set, else the probe's
/// `terminationGracePeriodSeconds` if set, else the pod's. (The runtime then applies
/// its minimum of 2 s.)
#[must_use]
pub fn probe_kill_grace_period(pod: &Pod, container: &Container, probe_type: ProbeType) -> i64 {
    if let Some(g) = pod.metadata.deletion_grace_period_seconds {
        return g;
    }
    let Some(pod_grace) = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds) else {
        return MINIMUM_GRACE_PERIOD_SECS;
    };
    if probe_type != ProbeType::Readiness
        && let Some(g) = probe_type.probe_of(container).and_then(|p| p.termination_grace_period_seconds)
    {
        return g;
    }
    pod_grace
}

/// Upstream `minimumGracePeriodInSeconds`.
const MINIMUM_GRACE_PERIOD_SECS: i64 = 2;

/// The kill message of upstream's runtime manager for a container whose `probe_type`
/// probe failed.
/// Whether it restarts afterwards: the container's own restart policy if it has one
/// (`ContainerRestartRules`; its rules need an exit code, which a running container has
/// not), else the pod's.
fn kill_message(pod: &Pod, container: &Container, probe_type: ProbeType, sidecar: bool) -> (String, bool) {
    let what = if probe_type == ProbeType::Startup { "startup" } else { "liveness" };
    let name = &container.name;
    if sidecar {
        // Sidecars are always restarted; upstream does not say so in the message.
        return (format!("Init container {name} failed {what} probe"), true);
    }
    let restart = pod
        .spec
        .as_ref()
        .is_none_or(|spec| crate::container::helpers::container_restart_policy(container, spec) != "Never");
    let mut message = format!("Container {name} failed {what} probe");
    if restart {
        message.push_str(", will be restarted");
    }
    (message, restart)
}

/// The containers that get probe workers: regular ones, then sidecars (with `true`).
fn probed_containers(pod: &Pod) -> impl Iterator<Item = (&Container, bool)> {
    let spec = pod.spec.as_ref();
    let regular = spec.into_iter().flat_map(|s| s.containers.iter()).map(|c| (c, false));
    let sidecars = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| is_restartable_init_container(c))
        .map(|c| (c, true));
    regular.chain(sidecars)
}

/// A probe with the API server's defaults applied (`pkg/apis/core/v1/defaults.go`).
fn defaulted_probe(p: &Probe) -> Probe {
    let mut p = p.clone();
    p.timeout_seconds = Some(p.timeout_seconds.unwrap_or(1).max(1));
    p.period_seconds = Some(p.period_seconds.unwrap_or(10).max(1));
    p.success_threshold = Some(p.success_threshold.unwrap_or(1).max(1));
    p.failure_threshold = Some(p.failure_threshold.unwrap_or(3).max(1));
    p.initial_delay_seconds = Some(p.initial_delay_seconds.unwrap_or(0));
    p
}

/// The container id in a status (`containerd://<id>`), if set and not empty.
fn status_container_id(s: &ContainerStatus) -> Option<&str> {
    s.container_id.as_deref().filter(|id| !id.is_empty())
}

/// The runtime's id from `<runtime>://<id>`.
fn bare_container_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, bare)| bare)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ProbeKey {
    pod_uid: String,
    container: String,
    probe_type: ProbeType,
}

#[derive(Debug)]
struct WorkerHandle {
    generation: u64,
    stop: CancellationToken,
    trigger: Arc<Notify>,
}

/// Wall-clock time that advances with tokio's clock, so that paused-time tests can
/// move `startedAt`-relative delays along with the timers.
#[derive(Debug)]
struct Clock {
    wall: Timestamp,
    mono: tokio::time::Instant,
}

impl Clock {
    fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(self.mono.elapsed()).unwrap_or(SignedDuration::MAX);
        self.wall.checked_add(elapsed).unwrap_or(self.wall)
    }
}

struct Inner {
    runner: Arc<dyn ProbeRunner>,
    recorder: Arc<dyn EventRecorder>,
    metrics: Arc<ProberMetrics>,
    readiness: ResultsCache,
    liveness: ResultsCache,
    startup: ResultsCache,
    updates_tx: mpsc::UnboundedSender<ProbeUpdate>,
    updates_rx: Mutex<Option<mpsc::UnboundedReceiver<ProbeUpdate>>>,
    workers: Mutex<HashMap<ProbeKey, WorkerHandle>>,
    statuses: Mutex<HashMap<String, Arc<PodStatus>>>,
    next_generation: AtomicU64,
    /// When the manager (≈ the agent) started, for the first-probe jitter.
    start: tokio::time::Instant,
    clock: Clock,
    /// A number in [0, 1) for the first-probe jitter.
    jitter: fn() -> f64,
    shutdown: CancellationToken,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbeManager")
            .field("workers", &self.workers.lock().unwrap().len())
            .field("pods_with_status", &self.statuses.lock().unwrap().len())
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn cache(&self, probe_type: ProbeType) -> &ResultsCache {
        match probe_type {
            ProbeType::Liveness => &self.liveness,
            ProbeType::Readiness => &self.readiness,
            ProbeType::Startup => &self.startup,
        }
    }

    fn has_worker(&self, pod_uid: &str, container: &str, probe_type: ProbeType) -> bool {
        let key = ProbeKey { pod_uid: pod_uid.to_string(), container: container.to_string(), probe_type };
        self.workers.lock().unwrap().contains_key(&key)
    }

    /// Upstream `isContainerStarted` (minus the running check, done by callers).
    fn is_started(&self, pod_uid: &str, container: &str, container_id: &str) -> bool {
        if let Some(r) = self.startup.get(container_id) {
            return r == ProbeResult::Success;
        }
        // A startup probe that has not run yet means "not started"; none means started.
        !self.has_worker(pod_uid, container, ProbeType::Startup)
    }

    fn status(&self, pod_uid: &str) -> Option<Arc<PodStatus>> {
        self.statuses.lock().unwrap().get(pod_uid).cloned()
    }

    /// Called by a worker as it exits; a newer worker under the same key stays.
    fn remove_worker(&self, key: &ProbeKey, generation: u64) {
        let mut workers = self.workers.lock().unwrap();
        if workers.get(key).is_some_and(|w| w.generation == generation) {
            workers.remove(key);
        }
    }

    fn stop_where(&self, pred: impl Fn(&ProbeKey) -> bool) {
        for (key, w) in self.workers.lock().unwrap().iter() {
            if pred(key) {
                w.stop.cancel();
            }
        }
    }
}

/// Runs the probe workers and keeps their results (upstream `prober.Manager` plus the
/// three `results.Manager`s). Cheap to clone; must be used inside a tokio runtime.
#[derive(Clone, Debug)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

fn random_fraction() -> f64 {
    rand::random::<f64>()
}

impl ProbeManager {
    /// A manager whose probes go through `runner`, events to `recorder` and samples to
    /// `metrics`. Create it when the agent starts: the first-probe jitter applies to
    /// workers started within one probe period of this.
    #[must_use]
    pub fn new(runner: Arc<dyn ProbeRunner>, recorder: Arc<dyn EventRecorder>, metrics: Arc<ProberMetrics>) -> Self {
        Self::with_jitter(runner, recorder, metrics, random_fraction)
    }

    /// As [`ProbeManager::new`], with `jitter` (returning a number in [0, 1)) choosing
    /// which part of the period a worker waits before its first probe.
    #[must_use]
    pub fn with_jitter(
        runner: Arc<dyn ProbeRunner>,
        recorder: Arc<dyn EventRecorder>,
        metrics: Arc<ProberMetrics>,
        jitter: fn() -> f64,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let now = tokio::time::Instant::now();
        Self {
            inner: Arc::new(Inner {
                runner,
                recorder,
                metrics,
                readiness: ResultsCache::new(ProbeType::Readiness),
                liveness: ResultsCache::new(ProbeType::Liveness),
                startup: ResultsCache::new(ProbeType::Startup),
                updates_tx: tx,
                updates_rx: Mutex::new(Some(rx)),
                workers: Mutex::new(HashMap::new()),
                statuses: Mutex::new(HashMap::new()),
                next_generation: AtomicU64::new(1),
                start: now,
                clock: Clock { wall: Timestamp::now(), mono: now },
                jitter,
                shutdown: CancellationToken::new(),
            }),
        }
    }

    /// The stream of result changes; `None` after the first call.
    #[must_use]
    pub fn take_updates(&self) -> Option<mpsc::UnboundedReceiver<ProbeUpdate>> {
        self.inner.updates_rx.lock().unwrap().take()
    }

    /// The wall-clock time the workers use (follows tokio's clock).
    #[must_use]
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// Starts the missing probe workers of `pod` (upstream `AddPod`). Call it on every
    /// pod sync; workers that exist are left alone (probe changes are not picked up, as
    /// upstream: probes are immutable).
    pub fn add_pod(&self, pod: &Pod) {
        let uid = pod_uid(pod);
        let pod_arc = Arc::new(pod.clone());
        let mut workers = self.inner.workers.lock().unwrap();
        for (container, sidecar) in probed_containers(pod) {
            for probe_type in [ProbeType::Startup, ProbeType::Readiness, ProbeType::Liveness] {
                let Some(probe) = probe_type.probe_of(container) else { continue };
                let key = ProbeKey { pod_uid: uid.to_string(), container: container.name.clone(), probe_type };
                if workers.contains_key(&key) {
                    tracing::trace!(pod = %uid, container = %container.name, %probe_type, "probe worker exists");
                    continue;
                }
                let generation = self.inner.next_generation.fetch_add(1, Ordering::Relaxed);
                let stop = self.inner.shutdown.child_token();
                let trigger = Arc::new(Notify::new());
                let w = worker::Worker::new(
                    self.inner.clone(),
                    key.clone(),
                    generation,
                    pod_arc.clone(),
                    container.clone(),
                    sidecar,
                    defaulted_probe(probe),
                );
                tokio::spawn(w.run(stop.clone(), trigger.clone()));
                workers.insert(key, WorkerHandle { generation, stop, trigger });
            }
        }
    }

    /// Stops the liveness and startup workers of the pod's regular containers (upstream
    /// `StopLivenessAndStartup`, called when the pod starts terminating; sidecars keep
    /// their liveness probes while the pod shuts down).
    pub fn stop_liveness_and_startup(&self, pod: &Pod) {
        let uid = pod_uid(pod);
        let names: HashSet<&str> = pod.spec.iter().flat_map(|s| s.containers.iter()).map(|c| c.name.as_str()).collect();
        self.inner.stop_where(|k| {
            k.pod_uid == uid && k.probe_type != ProbeType::Readiness && names.contains(k.container.as_str())
        });
    }

    /// Stops every worker of the pod and forgets its status (upstream `RemovePod`). The
    /// workers drop their cached results as they exit.
    pub fn remove_pod(&self, pod_uid: &str) {
        self.inner.stop_where(|k| k.pod_uid == pod_uid);
        self.inner.statuses.lock().unwrap().remove(pod_uid);
    }

    /// Stops the workers of every pod not in `desired` (upstream `CleanupPods`).
    pub fn cleanup_pods(&self, desired: &HashSet<String>) {
        self.inner.stop_where(|k| !desired.contains(&k.pod_uid));
        self.inner.statuses.lock().unwrap().retain(|uid, _| desired.contains(uid));
    }

    /// Stops every worker (agent shutdown).
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Feeds the latest status of a pod (container ids, `state.running.startedAt`,
    /// `state.terminated`, phase, pod IP). Workers wait until a status with their
    /// container's id is here.
    pub fn set_pod_status(&self, pod_uid: &str, status: &PodStatus) {
        self.inner.statuses.lock().unwrap().insert(pod_uid.to_string(), Arc::new(status.clone()));
    }

    /// Sets `started` and `ready` of every container status from the probe results
    /// (upstream `UpdatePodStatus`):
    /// - `started`: running, and the startup probe succeeded (or there is none);
    /// - `ready` (regular containers and sidecars): started, running, and the readiness
    ///   probe succeeded (or there is none). A readiness probe without a success yet is
    ///   asked to run now rather than at its next tick;
    /// - `ready` (other init containers): terminated with exit code 0.
    pub fn update_pod_status(&self, pod: &Pod, status: &mut PodStatus) {
        let uid = pod_uid(pod);
        for s in status.container_statuses.iter_mut().flatten() {
            let started = self.container_started(uid, s);
            s.started = Some(started);
            s.ready = started && self.container_ready(uid, s);
        }
        let init_specs: HashMap<&str, &Container> =
            pod.spec.iter().flat_map(|sp| sp.init_containers.iter().flatten()).map(|c| (c.name.as_str(), c)).collect();
        for s in status.init_container_statuses.iter_mut().flatten() {
            let started = self.container_started(uid, s);
            s.started = Some(started);
            let sidecar = init_specs.get(s.name.as_str()).is_some_and(|c| is_restartable_init_container(c));
            if sidecar {
                s.ready = started && self.container_ready(uid, s);
            } else {
                s.ready = s.state.as_ref().and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code == 0);
            }
        }
    }

    fn container_started(&self, uid: &str, s: &ContainerStatus) -> bool {
        if s.state.as_ref().and_then(|st| st.running.as_ref()).is_none() {
            return false;
        }
        self.inner.is_started(uid, &s.name, status_container_id(s).unwrap_or_default())
    }

    fn container_ready(&self, uid: &str, s: &ContainerStatus) -> bool {
        if s.state.as_ref().and_then(|st| st.running.as_ref()).is_none() {
            return false;
        }
        let id = status_container_id(s).unwrap_or_default();
        if self.inner.readiness.get(id) == Some(ProbeResult::Success) {
            return true;
        }
        let key = ProbeKey { pod_uid: uid.to_string(), container: s.name.clone(), probe_type: ProbeType::Readiness };
        let workers = self.inner.workers.lock().unwrap();
        match workers.get(&key) {
            // No readiness probe: ready once started.
            None => true,
            Some(w) => {
                // Probe now instead of waiting for the next tick.
                w.trigger.notify_one();
                false
            }
        }
    }

    /// The cached result of a container's `probe_type` probe, by the container id of
    /// its status (`containerd://<id>`).
    #[must_use]
    pub fn result(&self, probe_type: ProbeType, container_id: &str) -> Option<ProbeResult> {
        self.inner.cache(probe_type).get(container_id)
    }

    /// The readiness results (upstream `readinessManager`).
    #[must_use]
    pub fn readiness(&self) -> &ResultsCache {
        &self.inner.readiness
    }

    /// The liveness results (upstream `livenessManager`).
    #[must_use]
    pub fn liveness(&self) -> &ResultsCache {
        &self.inner.liveness
    }

    /// The startup results (upstream `startupManager`).
    #[must_use]
    pub fn startup(&self) -> &ResultsCache {
        &self.inner.startup
    }

    /// Whether the running container `container_id` of `pod` must be killed because of
    /// its probes, with upstream's message and grace period: a liveness `Failure`, then
    /// a startup `Failure` (for sidecars: startup first, then liveness).
    #[must_use]
    pub fn container_to_kill(&self, pod: &Pod, container_name: &str, container_id: &str) -> Option<ProbeKill> {
        let (container, sidecar) = probed_containers(pod).find(|(c, _)| c.name == container_name)?;
        let order: [ProbeType; 2] =
            if sidecar { [ProbeType::Startup, ProbeType::Liveness] } else { [ProbeType::Liveness, ProbeType::Startup] };
        let probe_type =
            order.into_iter().find(|t| self.inner.cache(*t).get(container_id) == Some(ProbeResult::Failure))?;
        let (message, restart) = kill_message(pod, container, probe_type, sidecar);
        Some(ProbeKill {
            probe_type,
            message,
            grace_period_seconds: probe_kill_grace_period(pod, container, probe_type),
            restart,
        })
    }

    /// How many workers run.
    #[must_use]
    pub fn worker_count(&self) -> usize {
        self.inner.workers.lock().unwrap().len()
    }

    /// Whether a worker runs for this container and probe type.
    #[must_use]
    pub fn has_worker(&self, pod_uid: &str, container: &str, probe_type: ProbeType) -> bool {
        self.inner.has_worker(pod_uid, container, probe_type)
    }
}
