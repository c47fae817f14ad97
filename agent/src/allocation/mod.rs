//! In-place pod resize (`InPlacePodVerticalScaling`, GA in 1.35): the allocation manager
//! (upstream `pkg/kubelet/allocation`) and the resize status the kubelet reports.
//!
//! - **Allocation**: the resources the node has admitted each pod with, checkpointed in
//!   `<root-dir>/allocated_pods_state` ([`checkpoint`], upstream's format). An admission is
//!   written before the pod's cgroup and containers are made
//!   ([`AllocationManager::write_admitted`]), not at once as upstream does: the pods
//!   admitted meanwhile go in the same write, so a burst of 100 admissions is a few
//!   `fsync`s, not 100 on the sync loop (whose tail on these disks reaches 80 ms). A
//!   crash between admission and that write loses nothing that ran: the pod is admitted
//!   again from its spec. Resizes and removals are written at once. Pods run with
//!   their *allocated* resources ([`AllocationManager::update_pod_from_allocation`]), not
//!   the ones the API spec asks for: a resize changes the allocation only once admitted.
//! - **Admitting a resize** ([`AllocationManager::handle_resize`]): `Infeasible` when it
//!   can never fit (static pods, Guaranteed pods under the static CPU or memory manager
//!   policy, more cpu or memory than the node's allocatable), `Deferred` when it does not
//!   fit next to the other pods now (the node-fit message); otherwise the allocation is
//!   checkpointed, `PodResizeInProgress` is set and `ResizeStarted` recorded. Deferred
//!   resizes stay queued ([`AllocationManager::retry_pending`]) and are retried when pods
//!   go away or finish, another resize is allocated, or periodically (upstream's 30 s, then
//!   3 min); an infeasible one is evaluated again when the pod's spec changes.
//! - **Actuated resources** (in memory): what each running container was last given,
//!   recorded at container start ([`ActuationHook`]) and after `UpdateContainerResources`.
//!   After an agent restart the resources CRI reports stand in; a runtime that reports
//!   none gets the allocation re-applied in place once by [`crate::runtime::resize`] (an
//!   idempotent update, never a restart).
//! - **Status** ([`AllocationManager::amend_status`]): `allocatedResources` (the allocated
//!   requests) and `resources` (actual, from CRI `ContainerStatus.resources` when the
//!   runtime reports them, else the actuated record) of running containers, the
//!   `PodResizePending` / `PodResizeInProgress` conditions with `observedGeneration`, and
//!   `status.observedGeneration` and that of the kubelet's own conditions (upstream's
//!   `PodObservedGenerationTracking`); the pod-level `allocatedResources` and
//!   `resources` every pod shows ([`pod_level`]).
//!
//! - **Pod-level resources** (`InPlacePodLevelResourcesVerticalScaling`, beta and on in
//!   1.37; the node declares it): a pod's `spec.resources` are allocated and checkpointed
//!   (`PodLevelResources`) and admitted like a container's, on the pod's requests; the
//!   pod-level resources the pod cgroup was last given are recorded when the pod is first
//!   synced ([`AllocationManager::initialize_pod_actuated`]) and after each resize, and the
//!   resize is in progress until they match the allocation. Containers without their own
//!   limits inherit the pod-level ones and are resized with them
//!   ([`ResourceValues::of_container`]).
//!
//! Deviations: swap is never on for containers here (`failSwapOn`, no `LimitedSwap`), so
//! the swap infeasibility check never fires; a memory limit set or lowered below the
//! pod's current usage fails with upstream's message and is retried at the next sync
//! (per-container usage is not checked). The actuated records are kept in upstream's
//! `actuated_pods_state` (written at every change, without `fsync`: they describe running
//! containers, which a machine crash ends anyway); a container's record holds the values
//! its cgroup was given, pod-level limits it inherits included, where upstream's holds its
//! own requirements.

pub mod checkpoint;
pub mod metrics;
pub mod pod_level;

use crate::types::pod::uid as pod_uid;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::container::{ContainerState, RuntimePodStatus, api};
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::lifecycle::admission::Rejection;
use crate::types::pod_resources;
use crate::types::qos::{QosClass, qos_class};
use crate::types::quantity;
use checkpoint::PodAllocation;
pub use metrics::ResizeMetrics;

/// Condition types and reasons (upstream `v1.PodResizePending`, `v1.PodReasonDeferred`, ...).
pub mod reasons {
    pub const POD_RESIZE_PENDING: &str = "PodResizePending";
    pub const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
    pub const DEFERRED: &str = "Deferred";
    pub const INFEASIBLE: &str = "Infeasible";
    pub const ERROR: &str = "Error";
}

/// Event reasons (upstream `pkg/kubelet/events`).
pub mod event_reasons {
    pub const RESIZE_STARTED: &str = "ResizeStarted";
    pub const RESIZE_COMPLETED: &str = "ResizeCompleted";
    pub const RESIZE_DEFERRED: &str = "ResizeDeferred";
    pub const RESIZE_INFEASIBLE: &str = "ResizeInfeasible";
    pub const RESIZE_ERROR: &str = "ResizeError";
}

/// Retry triggers (the `retry_trigger` label of `kubelet_pod_deferred_accepted_resizes_total`).
pub mod triggers {
    pub const POD_RESIZED: &str = "pod_resized";
    pub const PODS_REMOVED: &str = "pods_removed";
    pub const POD_TERMINATED: &str = "pod_terminated";
    pub const PERIODIC: &str = "periodic_retry";
}

/// First periodic retry of pending resizes after start, then the steady period (upstream
/// `initialRetryDelay`, `retryDelay`).
pub const INITIAL_RETRY_DELAY: Duration = Duration::from_secs(30);
pub const RETRY_DELAY: Duration = Duration::from_mins(3);

/// Errors of the allocation manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
}

/// What the node offers a resize, besides the pods already there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeResizeConfig {
    /// `cpuManagerPolicy: static`: Guaranteed pods' cpu cannot be resized.
    pub static_cpu_policy: bool,
    /// `memoryManagerPolicy: Static`: Guaranteed pods' memory cannot be resized.
    pub static_memory_policy: bool,
}

/// How a resize is checked against the node (given by the sync loop).
pub struct ResizeContext<'a> {
    /// Node allocatable (cpu in millicores, memory in bytes), when the node is known.
    pub allocatable: Option<(i64, i64)>,
    /// Admits the pod with its desired resources next to the other active pods (their
    /// allocated resources): the node-fit predicates (see `sync_loop/resize.rs`).
    pub fits: &'a dyn Fn(&Pod) -> Result<(), Rejection>,
}

impl std::fmt::Debug for ResizeContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResizeContext").field("allocatable", &self.allocatable).finish_non_exhaustive()
    }
}

/// The resources of one container as the kubelet compares them (upstream
/// `containerResources`): cpu in millicores, memory in bytes, 0 = unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceValues {
    pub cpu_request: i64,
    pub cpu_limit: i64,
    pub memory_request: i64,
    pub memory_limit: i64,
}

fn milli(list: Option<&BTreeMap<String, Quantity>>, r: &str) -> i64 {
    list.and_then(|l| l.get(r)).and_then(|q| quantity::parse_milli_cpu(&q.0).ok()).unwrap_or(0)
}

fn bytes(list: Option<&BTreeMap<String, Quantity>>, r: &str) -> i64 {
    list.and_then(|l| l.get(r)).and_then(|q| quantity::parse_bytes(&q.0).ok()).unwrap_or(0)
}

impl ResourceValues {
    /// The values of container `c` of `pod` as the kubelet compares them (upstream
    /// `containerResourcesFromRequirements`): a limit the container does not set is the
    /// pod-level one, which the container's cgroup gets.
    #[must_use]
    pub fn of_container(pod: &Pod, c: &Container) -> Self {
        let mut values = Self::of(c.resources.as_ref());
        let pod_level = Self::of(pod.spec.as_ref().and_then(|s| s.resources.as_ref()));
        if values.cpu_limit == 0 {
            values.cpu_limit = pod_level.cpu_limit;
        }
        if values.memory_limit == 0 {
            values.memory_limit = pod_level.memory_limit;
        }
        values
    }

    /// The pod-level values of `pod` (zero where it sets none).
    #[must_use]
    pub fn of_pod(pod: &Pod) -> Self {
        Self::of(pod.spec.as_ref().and_then(|s| s.resources.as_ref()))
    }

    /// The values of a container's requirements.
    #[must_use]
    pub fn of(r: Option<&ResourceRequirements>) -> Self {
        let req = r.and_then(|r| r.requests.as_ref());
        let lim = r.and_then(|r| r.limits.as_ref());
        Self {
            cpu_request: milli(req, "cpu"),
            cpu_limit: milli(lim, "cpu"),
            memory_request: bytes(req, "memory"),
            memory_limit: bytes(lim, "memory"),
        }
    }

    /// Requirements holding these values (zero values are left out).
    #[must_use]
    pub fn to_requirements(self) -> ResourceRequirements {
        let mut requests = BTreeMap::new();
        let mut limits = BTreeMap::new();
        if self.cpu_request > 0 {
            requests.insert("cpu".to_string(), milli_quantity(self.cpu_request));
        }
        if self.memory_request > 0 {
            requests.insert("memory".to_string(), binary_quantity(self.memory_request));
        }
        if self.cpu_limit > 0 {
            limits.insert("cpu".to_string(), milli_quantity(self.cpu_limit));
        }
        if self.memory_limit > 0 {
            limits.insert("memory".to_string(), binary_quantity(self.memory_limit));
        }
        ResourceRequirements {
            requests: (!requests.is_empty()).then_some(requests),
            limits: (!limits.is_empty()).then_some(limits),
            ..Default::default()
        }
    }
}

/// A millicore value as the API prints it (`resource.NewMilliQuantity(v, DecimalSI)`).
#[must_use]
pub fn milli_quantity(m: i64) -> Quantity {
    if m % 1000 == 0 { Quantity((m / 1000).to_string()) } else { Quantity(format!("{m}m")) }
}

/// A byte count as the API prints it (`resource.NewQuantity(v, BinarySI)`).
#[must_use]
pub fn binary_quantity(b: i64) -> Quantity {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if b < 1024 {
        return Quantity(b.to_string());
    }
    let mut v = b;
    let mut suffix = "";
    for s in SUFFIXES {
        if v % 1024 != 0 {
            break;
        }
        v /= 1024;
        suffix = s;
    }
    if suffix.is_empty() { Quantity(b.to_string()) } else { Quantity(format!("{v}{suffix}")) }
}

/// Upstream `sharesToMilliCPU`.
#[must_use]
pub fn shares_to_milli_cpu(shares: i64) -> i64 {
    if shares < 2 {
        return 0;
    }
    (shares * 1000 + 1023) / 1024
}

/// The resources CRI reports for a container (upstream `toKubeContainerResources`):
/// (cpu request, cpu limit, memory limit), each only when set.
#[must_use]
pub fn cri_values(r: &api::LinuxContainerResources) -> (Option<i64>, Option<i64>, Option<i64>) {
    let cpu_limit = (r.cpu_quota > 0 && r.cpu_period > 0).then(|| r.cpu_quota * 1000 / r.cpu_period);
    let cpu_request = (r.cpu_shares > 0).then(|| shares_to_milli_cpu(r.cpu_shares));
    let memory_limit = (r.memory_limit_in_bytes > 0).then_some(r.memory_limit_in_bytes);
    (cpu_request, cpu_limit, memory_limit)
}

/// Containers whose resources a resize may change (upstream `IsResizableContainer`): app
/// containers and every init container, sidecar or not
/// (`InPlacePodVerticalScalingInitContainers`, GA in 1.37; a plain init container is
/// resized while it runs).
pub fn resizable_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .chain(spec.into_iter().flat_map(|s| s.containers.iter()))
}

/// Now, at the second precision of `metav1.Time` on the wire.
fn now() -> Time {
    let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Time(jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0)).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// The allocation of `pod`'s resizable containers (upstream `allocationFromPod`).
fn allocation_from_pod(pod: &Pod) -> PodAllocation {
    PodAllocation {
        container_resources: resizable_containers(pod)
            .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
            .collect(),
        pod_level_resources: Some(pod.spec.as_ref().and_then(|s| s.resources.clone())),
    }
}

fn requirements_equal(a: Option<&ResourceRequirements>, b: Option<&ResourceRequirements>) -> bool {
    let norm = |r: Option<&ResourceRequirements>| {
        let r = r.cloned().unwrap_or_default();
        (r.requests.filter(|m| !m.is_empty()), r.limits.filter(|m| !m.is_empty()))
    };
    norm(a) == norm(b)
}

/// `pod` with the resources of `alloc` (upstream `updatePodFromAllocation`). An
/// allocation whose pod-level resources are unknown (checkpointed before they were)
/// leaves the spec's, where upstream would drop them.
fn pod_from_allocation(pod: &Pod, alloc: &PodAllocation) -> (Pod, bool) {
    let mut out = pod.clone();
    let mut updated = false;
    if let Some(spec) = out.spec.as_mut() {
        if let Some(a) = &alloc.pod_level_resources
            && !requirements_equal(spec.resources.as_ref(), a.as_ref())
        {
            spec.resources.clone_from(a);
            updated = true;
        }
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            if let Some(a) = alloc.container_resources.get(&c.name)
                && !requirements_equal(c.resources.as_ref(), Some(a))
            {
                c.resources = Some(a.clone());
                updated = true;
            }
        }
    }
    (out, updated)
}

/// The conditions the kubelet itself computes (besides the resize ones).
const KUBELET_CONDITIONS: [&str; 4] = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"];

/// The two resize conditions of a pod.
#[derive(Clone, Debug, Default, PartialEq)]
struct ResizeConditions {
    pending: Option<PodCondition>,
    in_progress: Option<PodCondition>,
}

/// Upstream `updatedPodResizeCondition`: the transition time only moves with the reason.
fn resize_condition(
    type_: &str,
    old: Option<&PodCondition>,
    reason: &str,
    message: &str,
    generation: i64,
) -> PodCondition {
    let now = now();
    let transition = match old {
        Some(o) if o.reason.as_deref().unwrap_or_default() == reason => o.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    PodCondition {
        type_: type_.into(),
        status: "True".into(),
        observed_generation: (generation > 0).then_some(generation),
        last_probe_time: Some(now),
        last_transition_time: transition,
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        message: (!message.is_empty()).then(|| message.to_string()),
    }
}

#[derive(Debug, Default)]
struct Inner {
    allocated: BTreeMap<String, PodAllocation>,
    /// Bumped at every change of `allocated` (the checkpoint on disk has
    /// [`AllocationManager::written`]'s).
    allocated_version: u64,
    /// pod uid -> container name -> what the running container was last given.
    actuated: HashMap<String, HashMap<String, ResourceValues>>,
    /// pod uid -> the pod-level resources its pod cgroup was last given.
    pod_actuated: HashMap<String, ResourceValues>,
    conditions: HashMap<String, ResizeConditions>,
    /// Pods with a deferred or infeasible resize, in retry order.
    pending: Vec<String>,
    /// The desired resources last seen per pod (counts each requested resize once).
    last_desired: HashMap<String, PodAllocation>,
    /// When the periodic retry runs next.
    next_retry: Option<Instant>,
    /// Pods seen terminal at the last housekeeping.
    terminal: HashSet<String>,
}

/// The allocation manager (see the module docs).
pub struct AllocationManager {
    path: Option<PathBuf>,
    /// `actuated_pods_state`, beside the allocation checkpoint.
    actuated_path: Option<PathBuf>,
    /// Held while the actuated records are written, so that writes land in order.
    actuated_writes: Mutex<()>,
    /// Held while the checkpoint is written, so that writes land in order.
    writes: Mutex<()>,
    /// The version of the allocations on disk ([`Inner`]'s `allocated_version`).
    written: AtomicU64,
    inner: Mutex<Inner>,
    recorder: Option<Arc<dyn EventRecorder>>,
    metrics: ResizeMetrics,
    node: NodeResizeConfig,
}

impl std::fmt::Debug for AllocationManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocationManager").field("path", &self.path).field("node", &self.node).finish_non_exhaustive()
    }
}

impl AllocationManager {
    /// The manager with its checkpoint in `root_dir`.
    ///
    /// # Errors
    /// The checkpoint cannot be read or is corrupt (upstream refuses to start too).
    pub fn new(root_dir: &Path, node: NodeResizeConfig, metrics: ResizeMetrics) -> Result<Self, Error> {
        let path = root_dir.join(checkpoint::FILE_NAME);
        let allocated = checkpoint::load(&path)?;
        let actuated_path = root_dir.join(checkpoint::ACTUATED_FILE_NAME);
        let mut inner = Inner { allocated, ..Inner::default() };
        for (uid, record) in checkpoint::load(&actuated_path)? {
            let containers: HashMap<String, ResourceValues> = record
                .container_resources
                .iter()
                .map(|(name, r)| (name.clone(), ResourceValues::of(Some(r))))
                .collect();
            if !containers.is_empty() {
                inner.actuated.insert(uid.clone(), containers);
            }
            if let Some(pod_level) = &record.pod_level_resources {
                inner.pod_actuated.insert(uid, ResourceValues::of(pod_level.as_ref()));
            }
        }
        Ok(Self {
            path: Some(path),
            actuated_path: Some(actuated_path),
            actuated_writes: Mutex::new(()),
            writes: Mutex::new(()),
            written: AtomicU64::new(0),
            inner: Mutex::new(inner),
            recorder: None,
            metrics,
            node,
        })
    }

    /// A manager that keeps its allocations in memory only (tests).
    #[must_use]
    pub fn in_memory(node: NodeResizeConfig) -> Self {
        Self {
            path: None,
            actuated_path: None,
            actuated_writes: Mutex::new(()),
            writes: Mutex::new(()),
            written: AtomicU64::new(0),
            inner: Mutex::default(),
            recorder: None,
            metrics: ResizeMetrics::default(),
            node,
        }
    }

    /// Records `ResizeStarted`, `ResizeDeferred`, ... events through `recorder`.
    #[must_use]
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    fn event(&self, pod: &Pod, type_: EventType, reason: &str, message: String) {
        if let Some(r) = &self.recorder {
            r.record(pod_ref(pod), type_, reason, message);
        }
    }

    /// Writes the actuated records (`actuated_pods_state`): each pod's containers and,
    /// once recorded, its pod-level resources (`null` for none, as upstream).
    fn persist_actuated(&self) {
        let Some(path) = &self.actuated_path else { return };
        let _order = self.actuated_writes.lock().unwrap();
        let records = {
            let inner = self.inner.lock().unwrap();
            let uids: BTreeSet<&String> = inner.actuated.keys().chain(inner.pod_actuated.keys()).collect();
            uids.into_iter()
                .map(|uid| {
                    let container_resources = inner
                        .actuated
                        .get(uid)
                        .into_iter()
                        .flatten()
                        .map(|(name, v)| (name.clone(), v.to_requirements()))
                        .collect();
                    let pod_level_resources = inner
                        .pod_actuated
                        .get(uid)
                        .map(|v| (*v != ResourceValues::default()).then(|| v.to_requirements()));
                    (uid.clone(), PodAllocation { container_resources, pod_level_resources })
                })
                .collect()
        };
        if let Err(e) = checkpoint::store_unsynced(path, &records) {
            tracing::error!(error = %e, "failed to write the actuated resources checkpoint");
        }
    }

    /// Writes the allocations to the checkpoint unless the disk has them already; a
    /// failed write is logged and left for the next call.
    fn persist(&self) {
        let _order = self.writes.lock().unwrap();
        let (snapshot, version) = {
            let inner = self.inner.lock().unwrap();
            if inner.allocated_version == self.written.load(Ordering::Acquire) {
                return;
            }
            (inner.allocated.clone(), inner.allocated_version)
        };
        if let Some(path) = &self.path
            && let Err(e) = checkpoint::store(path, &snapshot)
        {
            tracing::error!(error = %e, "failed to write the pod allocation checkpoint");
            return;
        }
        self.written.store(version, Ordering::Release);
    }

    /// Whether an allocation is not on disk yet (an admission's: see
    /// [`Self::write_admitted`]).
    #[must_use]
    pub fn has_unwritten(&self) -> bool {
        self.inner.lock().unwrap().allocated_version != self.written.load(Ordering::Acquire)
    }

    /// Writes the allocations of the pods admitted since the last write, in one write
    /// (it waits for the disk: call it off the async workers). The pod worker calls it
    /// before it makes a pod's cgroup and containers, so that an allocation is on disk
    /// before anything runs with it; admission itself ([`Self::add_pod`]) does not write,
    /// so a burst of admissions is one write rather than one a pod.
    pub fn write_admitted(&self) {
        self.persist();
    }

    /// The allocated resources of a container, if the pod was admitted.
    #[must_use]
    pub fn container_allocation(&self, uid: &str, container: &str) -> Option<ResourceRequirements> {
        self.inner.lock().unwrap().allocated.get(uid)?.container_resources.get(container).cloned()
    }

    /// Whether the pod has an allocation.
    #[must_use]
    pub fn is_pod_allocated(&self, uid: &str) -> bool {
        self.inner.lock().unwrap().allocated.contains_key(uid)
    }

    /// `pod` with its allocated resources, and whether they differ from its spec.
    #[must_use]
    pub fn update_pod_from_allocation(&self, pod: &Pod) -> (Pod, bool) {
        let inner = self.inner.lock().unwrap();
        match inner.allocated.get(pod_uid(pod)) {
            Some(a) => pod_from_allocation(pod, a),
            None => (pod.clone(), false),
        }
    }

    /// An admitted pod (upstream `AddPod` after admission): a pod seen for the first time
    /// is allocated what its spec asks; a pod known from the checkpoint (agent restart)
    /// keeps its allocation, and a spec that differs is a resize to handle.
    pub fn add_pod(&self, pod: &Pod) {
        let uid = pod_uid(pod).to_string();
        let mut inner = self.inner.lock().unwrap();
        inner.last_desired.insert(uid.clone(), allocation_from_pod(pod));
        match inner.allocated.get_mut(&uid) {
            // Checkpointed before pod-level resources were: the spec's are what it runs with.
            Some(a) if a.pod_level_resources.is_none() => {
                a.pod_level_resources = Some(pod.spec.as_ref().and_then(|s| s.resources.clone()));
            }
            Some(_) => return,
            None => {
                inner.allocated.insert(uid, allocation_from_pod(pod));
            }
        }
        // Written before the pod runs ([`Self::write_admitted`]), not here.
        inner.allocated_version += 1;
    }

    /// Forgets a pod that is gone from its source.
    pub fn remove_pod(&self, uid: &str) {
        let mut inner = self.inner.lock().unwrap();
        let had_actuated = inner.actuated.remove(uid).is_some() | inner.pod_actuated.remove(uid).is_some();
        inner.conditions.remove(uid);
        inner.pending.retain(|u| u != uid);
        inner.last_desired.remove(uid);
        if inner.allocated.remove(uid).is_some() {
            inner.allocated_version += 1;
            drop(inner);
            self.persist();
        } else {
            drop(inner);
        }
        if had_actuated {
            self.persist_actuated();
        }
        self.update_gauges();
    }

    /// Drops the state of every pod not in `keep` (upstream `RemoveOrphanedPods`).
    pub fn remove_orphans(&self, keep: &HashSet<String>) {
        let mut inner = self.inner.lock().unwrap();
        let before = inner.allocated.len();
        inner.allocated.retain(|u, _| keep.contains(u));
        let actuated_before = (inner.actuated.len(), inner.pod_actuated.len());
        inner.actuated.retain(|u, _| keep.contains(u));
        inner.pod_actuated.retain(|u, _| keep.contains(u));
        let actuated_changed = actuated_before != (inner.actuated.len(), inner.pod_actuated.len());
        inner.conditions.retain(|u, _| keep.contains(u));
        inner.pending.retain(|u| keep.contains(u));
        inner.last_desired.retain(|u, _| keep.contains(u));
        let changed = inner.allocated.len() != before;
        if changed {
            inner.allocated_version += 1;
        }
        drop(inner);
        if changed {
            self.persist();
        }
        if actuated_changed {
            self.persist_actuated();
        }
    }

    /// What the running container of `pod` was last given, if known.
    #[must_use]
    pub fn actuated(&self, uid: &str, container: &str) -> Option<ResourceValues> {
        self.inner.lock().unwrap().actuated.get(uid)?.get(container).copied()
    }

    /// Records what a container was given (at start, or by `UpdateContainerResources`).
    pub fn set_actuated(&self, uid: &str, container: &str, values: ResourceValues) {
        let mut inner = self.inner.lock().unwrap();
        let containers = inner.actuated.entry(uid.to_string()).or_default();
        if containers.get(container) == Some(&values) {
            return;
        }
        containers.insert(container.to_string(), values);
        drop(inner);
        self.persist_actuated();
    }

    /// What the pod cgroup of pod `uid` was last given at pod level, if known.
    #[must_use]
    pub fn pod_actuated(&self, uid: &str) -> Option<ResourceValues> {
        self.inner.lock().unwrap().pod_actuated.get(uid).copied()
    }

    /// Records what the pod cgroup was given at pod level (by a resize).
    pub fn set_pod_actuated(&self, uid: &str, values: ResourceValues) {
        if self.inner.lock().unwrap().pod_actuated.insert(uid.to_string(), values) != Some(values) {
            self.persist_actuated();
        }
    }

    /// Records the pod-level resources of `allocated_pod` (the pod with its allocation) as
    /// actuated when nothing is recorded yet (upstream `InitializeActuatedPod`, at every
    /// sync): its pod cgroup was made with them. After an agent restart the record comes
    /// from `actuated_pods_state`; only a pod without one (its pod cgroup made by an
    /// agent that kept none) takes the allocation for what the cgroup has.
    pub fn initialize_pod_actuated(&self, allocated_pod: &Pod) {
        let uid = pod_uid(allocated_pod);
        let mut inner = self.inner.lock().unwrap();
        if inner.pod_actuated.contains_key(uid) {
            return;
        }
        inner.pod_actuated.insert(uid.to_string(), ResourceValues::of_pod(allocated_pod));
        drop(inner);
        self.persist_actuated();
    }

    /// Counts the container resizes `pod` asks for that were not seen before
    /// (`kubelet_container_requested_resizes_total`).
    fn record_requested(&self, inner: &mut Inner, pod: &Pod) {
        let uid = pod_uid(pod).to_string();
        let desired = allocation_from_pod(pod);
        let previous = inner.last_desired.insert(uid, desired.clone());
        let Some(previous) = previous else { return };
        for (name, new) in &desired.container_resources {
            let Some(old) = previous.container_resources.get(name) else { continue };
            self.metrics.count_requested(old, new);
        }
    }

    /// Upstream `handlePodResourcesResize` for a pod whose spec may differ from its
    /// allocation: admits the resize (allocation checkpointed, `PodResizeInProgress`,
    /// `ResizeStarted`) or marks it pending (`Infeasible` / `Deferred`, with an event when
    /// that changes) and queues it for retries. Returns whether a resize was allocated.
    pub fn handle_resize(&self, pod: &Pod, ctx: &ResizeContext<'_>) -> bool {
        let uid = pod_uid(pod).to_string();
        let alloc = {
            let mut inner = self.inner.lock().unwrap();
            self.record_requested(&mut inner, pod);
            inner.allocated.get(&uid).cloned()
        };
        let Some(alloc) = alloc else { return false };
        let (allocated_pod, differs) = pod_from_allocation(pod, &alloc);
        if !differs {
            let mut inner = self.inner.lock().unwrap();
            // Desired == allocated: nothing pending (a resize reverted, or done).
            if let Some(c) = inner.conditions.get_mut(&uid) {
                c.pending = None;
            }
            inner.pending.retain(|u| *u != uid);
            drop(inner);
            self.update_gauges();
            return false;
        }
        let generation = pod.metadata.generation.unwrap_or(0);
        // Unlocked: the fit check looks at the other pods' allocations.
        let verdict = self.can_resize(pod, &allocated_pod, ctx);
        let mut inner = self.inner.lock().unwrap();
        match verdict {
            Ok(()) => {
                inner.allocated.insert(uid.clone(), allocation_from_pod(pod));
                inner.allocated_version += 1;
                inner.pending.retain(|u| *u != uid);
                let c = inner.conditions.entry(uid.clone()).or_default();
                c.pending = None;
                // A previous error is cleared; the generation moves on.
                c.in_progress = Some(resize_condition(reasons::POD_RESIZE_IN_PROGRESS, None, "", "", generation));
                drop(inner);
                self.persist();
                self.event(
                    pod,
                    EventType::Normal,
                    event_reasons::RESIZE_STARTED,
                    resize_message(pod, generation, "", "Pod resize started"),
                );
                self.update_gauges();
                true
            }
            Err((reason, message)) => {
                let c = inner.conditions.entry(uid.clone()).or_default();
                let old = c.pending.clone();
                let changed = old.as_ref().is_none_or(|o| {
                    o.reason.as_deref() != Some(reason) || o.message.as_deref().unwrap_or_default() != message
                });
                c.pending =
                    Some(resize_condition(reasons::POD_RESIZE_PENDING, old.as_ref(), reason, &message, generation));
                // Only a deferred resize waits for room; an infeasible one waits for a new spec.
                if reason != reasons::DEFERRED {
                    inner.pending.retain(|u| *u != uid);
                } else if !inner.pending.contains(&uid) {
                    inner.pending.push(uid.clone());
                }
                drop(inner);
                if changed {
                    let event = if reason == reasons::INFEASIBLE {
                        event_reasons::RESIZE_INFEASIBLE
                    } else {
                        event_reasons::RESIZE_DEFERRED
                    };
                    self.event(
                        pod,
                        EventType::Warning,
                        event,
                        resize_message(pod, generation, &message, &format!("Pod resize {reason}")),
                    );
                }
                self.update_gauges();
                false
            }
        }
    }

    /// Upstream `canResizePod` + the resize admit handler: `Err((reason, message))`.
    fn can_resize(&self, pod: &Pod, allocated: &Pod, ctx: &ResizeContext<'_>) -> Result<(), (&'static str, String)> {
        if crate::types::pod::is_static_pod(pod) {
            self.metrics.infeasible("static_pod");
            return Err((reasons::INFEASIBLE, "In-place resize of static-pods is not supported".into()));
        }
        if qos_class(pod) == QosClass::Guaranteed {
            let changed = |r: &str| {
                resizable_containers(pod).any(|c| {
                    let alloc = resizable_containers(allocated).find(|a| a.name == c.name);
                    let want = c.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|m| m.get(r));
                    let have = alloc
                        .and_then(|a| a.resources.as_ref())
                        .and_then(|r| r.requests.as_ref())
                        .and_then(|m| m.get(r));
                    want != have
                })
            };
            if self.node.static_cpu_policy && changed("cpu") {
                self.metrics.infeasible("guaranteed_pod_cpu_manager_static_policy");
                return Err((
                    reasons::INFEASIBLE,
                    "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\"".into(),
                ));
            }
            if self.node.static_memory_policy && changed("memory") {
                self.metrics.infeasible("guaranteed_pod_memory_manager_static_policy");
                return Err((
                    reasons::INFEASIBLE,
                    "Resize is infeasible for Guaranteed Pods alongside Memory Manager policy \"Static\"".into(),
                ));
            }
        }
        if let Some((cpu_available, mem_available)) = ctx.allocatable
            && pod.spec.is_some()
        {
            let want = pod_resources::pod_requests(pod);
            let cpu = pod_resources::get(&want, "cpu").milli_value_saturating();
            let mem = pod_resources::get(&want, "memory").value_saturating();
            if cpu > cpu_available || mem > mem_available {
                let detail = if mem > mem_available {
                    format!("memory, requested: {mem}, capacity: {mem_available}")
                } else {
                    format!("cpu, requested: {cpu}, capacity: {cpu_available}")
                };
                self.metrics.infeasible("insufficient_node_allocatable");
                return Err((reasons::INFEASIBLE, format!("Node didn't have enough capacity: {detail}")));
            }
        }
        (ctx.fits)(pod).map_err(|r| (reasons::DEFERRED, r.message))
    }

    /// Queues a pod whose resize could not be allocated.
    pub fn push_pending(&self, uid: &str) {
        let mut inner = self.inner.lock().unwrap();
        if !inner.pending.iter().any(|u| u == uid) {
            inner.pending.push(uid.to_string());
        }
    }

    /// Whether any resize waits.
    #[must_use]
    pub fn has_pending(&self) -> bool {
        !self.inner.lock().unwrap().pending.is_empty()
    }

    /// Notes the pods that are terminal now; true when one became terminal since the
    /// last call (their resources are free: upstream's `pod_terminated` trigger).
    pub fn note_terminal_pods(&self, terminal: &HashSet<String>) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let new = terminal.iter().any(|u| !inner.terminal.contains(u));
        inner.terminal.clone_from(terminal);
        new
    }

    /// Whether the periodic retry is due (upstream's ticker: 30 s after start, then every
    /// 3 minutes, reset by every retry).
    #[must_use]
    pub fn periodic_retry_due(&self, now: Instant) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let next = *inner.next_retry.get_or_insert(now + INITIAL_RETRY_DELAY);
        next <= now
    }

    /// Upstream `RetryPendingResizes`: tries every pending resize again, resizes that do
    /// not grow requests first, then by priority, then `QoS` (Guaranteed first), then the
    /// longest pending. `pod_of` gives the current API pod of a uid. Returns the pods to
    /// sync (a resize was allocated, or its conditions changed).
    pub fn retry_pending(
        &self,
        trigger: &str,
        pod_of: &dyn Fn(&str) -> Option<Pod>,
        ctx: &ResizeContext<'_>,
    ) -> Vec<Pod> {
        let pending = {
            let mut inner = self.inner.lock().unwrap();
            inner.next_retry = Some(Instant::now() + RETRY_DELAY);
            std::mem::take(&mut inner.pending)
        };
        let mut pods: Vec<Pod> = pending.iter().filter_map(|u| pod_of(u)).collect();
        pods.sort_by_cached_key(|p| {
            let (allocated, _) = self.update_pod_from_allocation(p);
            // Upstream `isResizeIncreasingRequests` (pod-level requests count).
            let grows = {
                let (n, o) = (pod_resources::pod_requests(p), pod_resources::pod_requests(&allocated));
                ["cpu", "memory"].iter().any(|r| {
                    pod_resources::get(&n, r).milli_value_saturating()
                        > pod_resources::get(&o, r).milli_value_saturating()
                })
            };
            let priority = p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
            let guaranteed = u8::from(qos_class(p) != QosClass::Guaranteed);
            let since = self
                .inner
                .lock()
                .unwrap()
                .conditions
                .get(pod_uid(p))
                .and_then(|c| c.pending.as_ref())
                .and_then(|c| c.last_transition_time.clone())
                .map(|t| t.0);
            (grows, -i64::from(priority), guaranteed, since)
        });
        let mut to_sync = Vec::new();
        for pod in pods {
            let uid = pod_uid(&pod).to_string();
            let before = self.inner.lock().unwrap().conditions.get(&uid).cloned();
            let was_deferred = before
                .as_ref()
                .and_then(|c| c.pending.as_ref())
                .is_some_and(|c| c.reason.as_deref() == Some(reasons::DEFERRED));
            let allocated = self.handle_resize(&pod, ctx);
            if allocated && was_deferred {
                self.metrics.deferred_accepted(trigger);
            }
            let after = self.inner.lock().unwrap().conditions.get(&uid).cloned();
            if allocated || before != after {
                to_sync.push(pod);
            }
        }
        to_sync
    }

    /// Upstream `CheckPodResizeInProgress`, after a sync: while a running container's
    /// actual resources differ from its allocation the resize is in progress; once they
    /// match, the condition goes and `ResizeCompleted` is recorded.
    pub fn check_resize_in_progress(&self, allocated_pod: &Pod, status: &RuntimePodStatus) {
        let uid = pod_uid(allocated_pod).to_string();
        let containers = resizable_containers(allocated_pod).any(|c| {
            let running = status.find_container(&c.name).is_some_and(|s| s.state == ContainerState::Running);
            running
                && self
                    .actuated(&uid, &c.name)
                    .is_some_and(|a| !values_match(ResourceValues::of_container(allocated_pod, c), a))
        });
        let pod_level = self
            .pod_actuated(&uid)
            .is_some_and(|actuated| !values_match(ResourceValues::of_pod(allocated_pod), actuated));
        let in_progress = containers || pod_level;
        let generation = allocated_pod.metadata.generation.unwrap_or(0);
        let mut inner = self.inner.lock().unwrap();
        if in_progress {
            let c = inner.conditions.entry(uid).or_default();
            if c.in_progress.is_none() {
                c.in_progress = Some(resize_condition(reasons::POD_RESIZE_IN_PROGRESS, None, "", "", generation));
            }
            drop(inner);
        } else if let Some(c) = inner.conditions.get_mut(&uid)
            && c.in_progress.take().is_some()
        {
            drop(inner);
            self.event(
                allocated_pod,
                EventType::Normal,
                event_reasons::RESIZE_COMPLETED,
                resize_message(allocated_pod, generation, "", "Pod resize completed"),
            );
        } else {
            drop(inner);
        }
        self.update_gauges();
    }

    /// A failed actuation: `PodResizeInProgress` with reason `Error` and the message, and a
    /// `ResizeError` event when the error is new.
    pub fn set_resize_error(&self, pod: &Pod, message: &str) {
        let uid = pod_uid(pod).to_string();
        let generation = pod.metadata.generation.unwrap_or(0);
        let mut inner = self.inner.lock().unwrap();
        let c = inner.conditions.entry(uid).or_default();
        let old = c.in_progress.clone();
        let changed = old.as_ref().is_none_or(|o| o.message.as_deref() != Some(message));
        c.in_progress =
            Some(resize_condition(reasons::POD_RESIZE_IN_PROGRESS, old.as_ref(), reasons::ERROR, message, generation));
        drop(inner);
        if changed {
            self.event(
                pod,
                EventType::Warning,
                event_reasons::RESIZE_ERROR,
                resize_message(pod, generation, message, "Pod resize error"),
            );
        }
        self.update_gauges();
    }

    /// A successful actuation: a previous `Error` on `PodResizeInProgress` goes (the
    /// condition itself stays until the resize is complete).
    pub fn clear_resize_error(&self, pod: &Pod) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(c) = inner.conditions.get_mut(pod_uid(pod))
            && let Some(p) = c.in_progress.as_mut()
            && p.reason.as_deref() == Some(reasons::ERROR)
        {
            p.reason = None;
            p.message = None;
        }
    }

    /// The resize metric families.
    #[must_use]
    pub fn metrics(&self) -> &ResizeMetrics {
        &self.metrics
    }

    /// The resize conditions of a pod (pending first), as the status carries them.
    #[must_use]
    pub fn conditions(&self, uid: &str) -> Vec<PodCondition> {
        let inner = self.inner.lock().unwrap();
        inner
            .conditions
            .get(uid)
            .map(|c| c.pending.iter().chain(c.in_progress.iter()).cloned().collect())
            .unwrap_or_default()
    }

    /// Sets what the kubelet reports about resizes in `status` (see the module docs).
    /// `api_pod` is the pod as its source has it.
    pub fn amend_status(&self, api_pod: &Pod, rt: &RuntimePodStatus, status: &mut PodStatus) {
        let uid = pod_uid(api_pod);
        let generation = api_pod.metadata.generation;
        if let Some(g) = generation {
            status.observed_generation = Some(g);
        }
        // The conditions the kubelet computes carry the generation they were computed for
        // (upstream's PodObservedGenerationTracking, on since 1.34).
        let mut conditions: Vec<PodCondition> = status
            .conditions
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_ != reasons::POD_RESIZE_PENDING && c.type_ != reasons::POD_RESIZE_IN_PROGRESS)
            .map(|mut c| {
                if KUBELET_CONDITIONS.contains(&c.type_.as_str()) && generation.is_some() {
                    c.observed_generation = generation;
                }
                c
            })
            .collect();
        conditions.extend(self.conditions(uid));
        status.conditions = Some(conditions);
        let resizable: HashSet<&str> = resizable_containers(api_pod).map(|c| c.name.as_str()).collect();
        for list in [status.container_statuses.as_mut(), status.init_container_statuses.as_mut()].into_iter().flatten()
        {
            for cs in list.iter_mut() {
                if !resizable.contains(cs.name.as_str()) {
                    continue;
                }
                let Some(alloc) = self.container_allocation(uid, &cs.name) else { continue };
                cs.allocated_resources = alloc.requests.clone().filter(|r| !r.is_empty());
                let running = rt.find_container(&cs.name).filter(|c| c.state == ContainerState::Running);
                cs.resources = running.map(|c| {
                    let reported = rt.container_resources.get(&c.id).map(cri_values);
                    actual_resources(&alloc, reported, self.actuated(uid, &cs.name))
                });
            }
        }
    }

    /// Updates `kubelet_pod_pending_resizes` and `kubelet_pod_in_progress_resizes`.
    fn update_gauges(&self) {
        let inner = self.inner.lock().unwrap();
        let (mut infeasible, mut deferred, mut in_progress) = (0, 0, 0);
        for c in inner.conditions.values() {
            match c.pending.as_ref().and_then(|p| p.reason.as_deref()) {
                Some(reasons::INFEASIBLE) => infeasible += 1,
                Some(reasons::DEFERRED) => deferred += 1,
                _ => {}
            }
            if c.in_progress.is_some() {
                in_progress += 1;
            }
        }
        drop(inner);
        self.metrics.set_gauges(infeasible, deferred, in_progress);
    }
}

/// Allocated and actual values are the same, minimum cpu values counting as equal
/// (upstream: requests at or below `MinShares`, limits at or below `MinMilliCPULimit`).
#[must_use]
pub fn values_match(mut desired: ResourceValues, current: ResourceValues) -> bool {
    const MIN_SHARES_MILLI: i64 = 2;
    const MIN_MILLI_CPU_LIMIT: i64 = 10;
    if desired.cpu_request <= MIN_SHARES_MILLI && current.cpu_request <= MIN_SHARES_MILLI {
        desired.cpu_request = current.cpu_request;
    }
    if desired.cpu_limit <= MIN_MILLI_CPU_LIMIT && current.cpu_limit <= MIN_MILLI_CPU_LIMIT {
        desired.cpu_limit = current.cpu_limit;
    }
    desired == current
}

/// `status.containerStatuses[].resources` of a running container (upstream
/// `convertContainerStatusResources`): the allocation, with the cpu request, cpu limit
/// and memory limit the runtime reports (or, when it reports none, those last actuated).
fn actual_resources(
    alloc: &ResourceRequirements,
    reported: Option<(Option<i64>, Option<i64>, Option<i64>)>,
    actuated: Option<ResourceValues>,
) -> ResourceRequirements {
    let mut out = alloc.clone();
    let (cpu_req, cpu_lim, mem_lim) = match (reported, actuated) {
        (Some(r), _) if r != (None, None, None) => r,
        (_, Some(a)) => (
            (a.cpu_request > 0).then_some(a.cpu_request),
            (a.cpu_limit > 0).then_some(a.cpu_limit),
            (a.memory_limit > 0).then_some(a.memory_limit),
        ),
        _ => (None, None, None),
    };
    let allocated = ResourceValues::of(Some(alloc));
    // Where the container has limits (requests), what the runtime reports is shown, also
    // for a resource it sets none of: a limit inherited from the pod level.
    if let Some(limits) = out.limits.as_mut() {
        if let Some(v) = cpu_lim
            && (v > 10 || allocated.cpu_limit > 10)
        {
            limits.insert("cpu".into(), milli_quantity(v));
        }
        if let Some(v) = mem_lim {
            limits.insert("memory".into(), binary_quantity(v));
        }
    }
    if let Some(requests) = out.requests.as_mut()
        && let Some(v) = cpu_req
        && (v > 2 || allocated.cpu_request > 2)
    {
        requests.insert("cpu".into(), milli_quantity(v));
    }
    out
}

#[derive(serde::Serialize)]
struct ContainerSummary<'a> {
    name: &'a str,
    resources: ResourceRequirements,
}

#[derive(serde::Serialize)]
struct ResourceSummary<'a> {
    #[serde(rename = "initContainers", skip_serializing_if = "Vec::is_empty")]
    init_containers: Vec<ContainerSummary<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    containers: Vec<ContainerSummary<'a>>,
    generation: i64,
    #[serde(skip_serializing_if = "str::is_empty")]
    error: &'a str,
}

/// The message of the resize events (upstream `podResizeMessage`): the prefix, then the
/// resources of every container, the generation and the error as JSON.
#[must_use]
pub fn resize_message(pod: &Pod, generation: i64, error: &str, prefix: &str) -> String {
    let spec = pod.spec.as_ref();
    let mut s = ResourceSummary { init_containers: Vec::new(), containers: Vec::new(), generation, error };
    for c in spec.into_iter().flat_map(|s| s.init_containers.iter().flatten()) {
        s.init_containers.push(ContainerSummary { name: &c.name, resources: c.resources.clone().unwrap_or_default() });
    }
    for c in spec.into_iter().flat_map(|s| s.containers.iter()) {
        s.containers.push(ContainerSummary { name: &c.name, resources: c.resources.clone().unwrap_or_default() });
    }
    match serde_json::to_string(&s) {
        Ok(json) => format!("{prefix}: {json}"),
        Err(_) => prefix.to_string(),
    }
}

/// Records what each container is given when it starts (the container manager hook).
#[derive(Debug)]
pub struct ActuationHook(pub Arc<AllocationManager>);

impl crate::cm::container_lifecycle::ContainerLifecycleHook for ActuationHook {
    fn pre_start_container(&self, pod: &Pod, container: &Container, _container_id: &str) -> Result<(), String> {
        self.0.set_actuated(pod_uid(pod), &container.name, ResourceValues::of_container(pod, container));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
