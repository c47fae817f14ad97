//! CPU manager (upstream `pkg/kubelet/cm/cpumanager`): policies `none` and `static`.
//!
//! With `static`, containers of Guaranteed pods whose cpu request is a whole number get
//! CPUs of their own; everything else runs in the shared pool (all CPUs minus the
//! exclusive ones, reserved CPUs included). Reserved CPUs are `reservedSystemCPUs` when
//! set, else ceil(kubeReserved.cpu + systemReserved.cpu) CPUs taken by the packed
//! algorithm ([`assignment`]); they are never handed out exclusively.
//!
//! - Admission: the topology manager asks [`CpuManager`] for hints (per container or per
//!   pod) and then calls `allocate` with the chosen NUMA affinity; an allocation failure
//!   rejects the pod (`SMTAlignmentError`, or `UnexpectedAdmissionError` "Allocate failed
//!   due to ..., which is unexpected", as upstream).
//! - Container creation ([`ContainerLifecycleHook`]): `cpuset_cpus` is the container's
//!   exclusive CPUs or the shared pool; the container id is remembered at start.
//! - [`CpuManager::reconcile`] (every `cpuManagerReconcilePeriod`, [`CpuManager::run`]):
//!   forgets pods that are no longer active (their CPUs return to the shared pool) and
//!   sets the cpuset of every running container whose CPUs changed through CRI
//!   `UpdateContainerResources` — so shared containers shrink when a pod gets exclusive
//!   CPUs and grow back when it is gone.
//! - State: `<root-dir>/cpu_manager_state` ([`state`]), restored at start; a checkpoint of
//!   another policy or one that contradicts the machine is a startup error, as upstream.
//!
//! Policy options (`cpuManagerPolicyOptions`, static only): `full-pcpus-only`,
//! `distribute-cpus-across-numa` and `strict-cpu-reservation` (beta: need the
//! `CPUManagerPolicyBetaOptions` gate, on by default), `align-by-socket` (alpha:
//! `CPUManagerPolicyAlphaOptions`). `distribute-cpus-across-cores` and
//! `prefer-align-cpus-by-uncorecache` are refused as unsupported; other names are
//! unknown options. Every problem is a startup error naming the option.

pub mod assignment;
pub mod state;

use crate::types::pod::uid as pod_uid;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio_util::sync::CancellationToken;

use crate::cm::container_lifecycle::ContainerLifecycleHook;
use crate::cm::machine_topology::MachineTopology;
use crate::cm::metrics::ResourceManagerMetrics;
use crate::cm::topology::{HintProvider, Hints, NumaMask, TopologyHint};
use crate::container::RuntimeService;
use crate::lifecycle::admission::Rejection;
use crate::types::cpuset::CpuSet;
use crate::types::pod_resources;
use crate::types::qos::{QosClass, qos_class};
use crate::types::resource_names::CPU;
use state::{Checkpoint, CpuState};

/// A CPU manager that cannot start (upstream's messages).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration problem.
    #[error("[cpumanager] {0}")]
    Config(String),
    /// The checkpoint cannot be restored or written.
    #[error(transparent)]
    State(#[from] state::Error),
    /// The restored state contradicts the machine or the configuration.
    #[error("[cpumanager] static policy invalid state, please drain node and remove policy state file: {0}")]
    InvalidState(String),
}

/// Static policy options (upstream `StaticPolicyOptions`).
#[expect(clippy::struct_excessive_bools, reason = "one flag per upstream option")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StaticPolicyOptions {
    /// `full-pcpus-only`: exclusive CPUs only in whole physical cores.
    pub full_pcpus_only: bool,
    /// `distribute-cpus-across-numa`: spread requests that need several NUMA nodes evenly.
    pub distribute_cpus_across_numa: bool,
    /// `align-by-socket`: NUMA-aligned CPUs are taken from the affinity's whole sockets.
    pub align_by_socket: bool,
    /// `strict-cpu-reservation`: reserved CPUs are out of the shared pool too.
    pub strict_cpu_reservation: bool,
}

impl StaticPolicyOptions {
    /// Parses `cpuManagerPolicyOptions` as upstream (`NewStaticPolicyOptions` and
    /// `ValidateStaticPolicyOptions`).
    ///
    /// # Errors
    /// The first bad option, named.
    pub fn parse(
        options: &BTreeMap<String, String>,
        feature_gates: &BTreeMap<String, bool>,
        topology_policy: &str,
        topo: &MachineTopology,
    ) -> Result<Self, String> {
        let gate = |name: &str, default: bool| feature_gates.get(name).copied().unwrap_or(default);
        let mut o = Self::default();
        if !options.is_empty() && !gate("CPUManagerPolicyOptions", true) {
            return Err("CPU Manager policy options are not enabled (feature gate CPUManagerPolicyOptions)".into());
        }
        for (name, value) in options {
            let (field, alpha) = match name.as_str() {
                "full-pcpus-only" => (&mut o.full_pcpus_only, false),
                "distribute-cpus-across-numa" => (&mut o.distribute_cpus_across_numa, false),
                "strict-cpu-reservation" => (&mut o.strict_cpu_reservation, false),
                "align-by-socket" => (&mut o.align_by_socket, true),
                "distribute-cpus-across-cores" | "prefer-align-cpus-by-uncorecache" => {
                    return Err(format!("CPU Manager Policy option {name:?} is not supported by swiftlet"));
                }
                _ => return Err(format!("unknown CPU Manager Policy option: {name:?}")),
            };
            if alpha && !gate("CPUManagerPolicyAlphaOptions", false) {
                return Err(format!(
                    "CPU Manager Policy Alpha-level Options not enabled, but option {name:?} provided"
                ));
            }
            if !alpha && !gate("CPUManagerPolicyBetaOptions", true) {
                return Err(format!("CPU Manager Policy Beta-level Options not enabled, but option {name:?} provided"));
            }
            *field = value.trim().parse::<bool>().map_err(|e| format!("bad value for option {name:?}: {e}"))?;
        }
        if o.align_by_socket {
            if topology_policy == "single-numa-node" {
                return Err(format!(
                    "Topology manager {topology_policy} policy is incompatible with CPUManager align-by-socket policy option"
                ));
            }
            if topo.numa_nodes().len() < topo.sockets().len() {
                return Err("Align by socket is not compatible with hardware where number of sockets are more than number of NUMA".into());
            }
        }
        Ok(o)
    }
}

/// What the CPU manager is built from (the `KubeletConfiguration` fields).
#[derive(Clone, Debug)]
pub struct CpuManagerConfig {
    /// `cpuManagerPolicy`: `none` or `static`.
    pub policy: String,
    /// `cpuManagerPolicyOptions`.
    pub options: BTreeMap<String, String>,
    /// `reservedSystemCPUs` (may be empty).
    pub reserved_system_cpus: String,
    /// kubeReserved.cpu + systemReserved.cpu in milli-CPU.
    pub reserved_milli_cpu: i64,
    /// `topologyManagerPolicy` (option compatibility).
    pub topology_policy: String,
    /// `featureGates`.
    pub feature_gates: BTreeMap<String, bool>,
    /// `cpuManagerReconcilePeriod`.
    pub reconcile_period: Duration,
}

/// The active pods (admitted, not terminal) for stale-state removal, or `None` while
/// some pod source has not delivered its pods yet (nothing is stale then).
pub type ActivePods = Arc<dyn Fn() -> Option<Vec<Pod>> + Send + Sync>;

#[derive(Debug, Default)]
struct Inner {
    state: CpuState,
    /// Per pod: CPUs of its init containers that its app containers may reuse.
    cpus_to_reuse: HashMap<String, CpuSet>,
    /// The cpuset last written to each container id by the reconcile loop.
    last_update: HashMap<String, CpuSet>,
}

/// The CPU manager (upstream `cpumanager.Manager`).
pub struct CpuManager {
    is_static: bool,
    topo: MachineTopology,
    reserved: CpuSet,
    options: StaticPolicyOptions,
    checkpoint: Checkpoint,
    inner: Mutex<Inner>,
    metrics: Option<Arc<ResourceManagerMetrics>>,
    reconcile_period: Duration,
    /// `DisableCPUQuotaWithExclusiveCPUs` (beta, on by default): containers and pods with
    /// exclusive CPUs run without a CFS quota.
    no_quota_with_exclusive: bool,
}

impl std::fmt::Debug for CpuManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuManager")
            .field("policy", &if self.is_static { "static" } else { "none" })
            .field("reserved", &self.reserved.to_string())
            .finish_non_exhaustive()
    }
}

/// Exclusive CPUs of a container: its whole cpu request when the pod is Guaranteed and
/// the request an integer, else 0 (upstream `guaranteedCPUs`).
#[must_use]
pub fn guaranteed_cpus(pod: &Pod, container: &Container) -> usize {
    if qos_class(pod) != QosClass::Guaranteed {
        return 0;
    }
    let q = pod_resources::get(&pod_resources::container_requests(container), CPU);
    match (q.value(), q.milli_value()) {
        (Some(v), Some(m)) if v * 1000 == m && v > 0 => v as usize,
        _ => 0,
    }
}

/// Exclusive CPUs of a pod (upstream `podGuaranteedCPUs`, with sidecars): the largest
/// of each plain init container's plus the sidecars started before it, and the app
/// containers' plus every sidecar's.
#[must_use]
pub fn pod_guaranteed_cpus(pod: &Pod) -> usize {
    let Some(spec) = pod.spec.as_ref() else { return 0 };
    let (mut init, mut sidecars) = (0, 0);
    for c in spec.init_containers.iter().flatten() {
        let n = guaranteed_cpus(pod, c);
        if pod_resources::is_restartable_init_container(c) {
            sidecars += n;
        } else {
            init = init.max(sidecars + n);
        }
    }
    let app: usize = spec.containers.iter().map(|c| guaranteed_cpus(pod, c)).sum();
    init.max(app + sidecars)
}

/// A plain init container: its CPUs are free again once it is done. A sidecar (a
/// restartable init container) runs next to the app containers and is not.
fn is_init_container(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|v| v.iter().any(|c| c.name == name && !pod_resources::is_restartable_init_container(c)))
}

impl CpuManager {
    /// Builds the manager and restores its state from `<root_dir>/cpu_manager_state`.
    ///
    /// # Errors
    /// Upstream's startup errors: static without reserved CPUs, reserved CPUs that do not
    /// exist or cannot be taken, bad policy options, a checkpoint of another policy or one
    /// that contradicts the machine.
    pub fn new(
        cfg: &CpuManagerConfig,
        topo: MachineTopology,
        root_dir: &Path,
        metrics: Option<Arc<ResourceManagerMetrics>>,
    ) -> Result<Self, Error> {
        let is_static = match cfg.policy.as_str() {
            "" | "none" => false,
            "static" => true,
            other => return Err(Error::Config(format!("unknown policy: \"{other}\""))),
        };
        let mut reserved = CpuSet::new();
        let mut options = StaticPolicyOptions::default();
        if is_static {
            options = StaticPolicyOptions::parse(&cfg.options, &cfg.feature_gates, &cfg.topology_policy, &topo)
                .map_err(Error::Config)?;
            let specific = CpuSet::parse(&cfg.reserved_system_cpus)
                .map_err(|e| Error::Config(format!("unable to parse reservedSystemCPUs: {e}")))?;
            // reservedSystemCPUs replaces the cpu of kubeReserved/systemReserved (upstream's
            // server.go), so the count to reserve is its size.
            let num = if specific.is_empty() {
                (cfg.reserved_milli_cpu.max(0) as usize).div_ceil(1000)
            } else {
                specific.len()
            };
            if num == 0 {
                return Err(Error::Config(
                    "the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero".into(),
                ));
            }
            reserved = if specific.is_empty() {
                assignment::take_packed(&topo, &topo.all_cpus(), num).unwrap_or_default()
            } else {
                specific
            };
            if !reserved.is_subset_of(&topo.all_cpus()) || reserved.len() != num {
                return Err(Error::Config(format!(
                    "unable to reserve the required amount of CPUs (size of {reserved} did not equal {num})"
                )));
            }
            tracing::info!(reserved = %reserved, ?options, "CPU manager static policy: reserved CPUs not available for exclusive assignment");
        }
        let checkpoint = Checkpoint::new(root_dir, if is_static { "static" } else { "none" });
        let mut state = checkpoint.restore()?;
        if is_static {
            validate_state(&mut state, &reserved, &topo).map_err(Error::InvalidState)?;
            checkpoint.store(&state)?;
        }
        Ok(Self {
            is_static,
            topo,
            reserved,
            options,
            checkpoint,
            inner: Mutex::new(Inner { state, ..Inner::default() }),
            metrics,
            reconcile_period: cfg.reconcile_period,
            no_quota_with_exclusive: cfg.feature_gates.get("DisableCPUQuotaWithExclusiveCPUs").copied().unwrap_or(true),
        })
    }

    /// The reserved CPUs (empty with the `none` policy).
    #[must_use]
    pub fn reserved(&self) -> &CpuSet {
        &self.reserved
    }

    /// A copy of the current state.
    #[must_use]
    pub fn state(&self) -> CpuState {
        self.inner.lock().unwrap().state.clone()
    }

    /// Whether a container of the pod `pod_uid` holds exclusive CPUs and
    /// `DisableCPUQuotaWithExclusiveCPUs` is on: its pod cgroup then gets no CFS quota
    /// (upstream `PodHasExclusiveCPUs` in the pod container manager).
    #[must_use]
    pub fn pod_runs_without_quota(&self, pod_uid: &str) -> bool {
        self.no_quota_with_exclusive
            && self.is_static
            && self.inner.lock().unwrap().state.assignments.get(pod_uid).is_some_and(|c| !c.is_empty())
    }

    /// The CPUs a container runs on: its exclusive CPUs, else the shared pool (without
    /// the reserved CPUs under `strict-cpu-reservation`); empty with the `none` policy.
    #[must_use]
    pub fn cpu_affinity(&self, pod_uid: &str, container: &str) -> CpuSet {
        let inner = self.inner.lock().unwrap();
        self.affinity_locked(&inner.state, pod_uid, container)
    }

    fn affinity_locked(&self, state: &CpuState, pod_uid: &str, container: &str) -> CpuSet {
        if !self.is_static {
            return CpuSet::new();
        }
        match state.get(pod_uid, container) {
            Some(c) => c.clone(),
            None if self.options.strict_cpu_reservation => state.default_cpuset.difference(&self.reserved),
            None => state.default_cpuset.clone(),
        }
    }

    fn available(&self, state: &CpuState) -> CpuSet {
        state.default_cpuset.difference(&self.reserved)
    }

    fn save(&self, state: &CpuState) {
        if let Err(e) = self.checkpoint.store(state) {
            tracing::error!(error = %e, "CPU manager: writing the checkpoint failed");
        }
    }

    fn update_cpus_to_reuse(inner: &mut Inner, pod: &Pod, container: &str, cpus: &CpuSet) {
        let uid = pod_uid(pod).to_owned();
        inner.cpus_to_reuse.retain(|u, _| *u == uid);
        let entry = inner.cpus_to_reuse.entry(uid).or_default();
        *entry = if is_init_container(pod, container) { entry.union(cpus) } else { entry.difference(cpus) };
    }

    fn allocate_static(&self, pod: &Pod, container: &Container, affinity: Option<NumaMask>) -> Result<(), AllocError> {
        let n = guaranteed_cpus(pod, container);
        if n == 0 {
            return Ok(());
        }
        if let Some(m) = &self.metrics {
            m.cpu_manager_pinning_requests.inc();
        }
        let mut inner = self.inner.lock().unwrap();
        let uid = pod_uid(pod).to_owned();
        // Already allocated (a re-admission after a restart): keep it.
        let result = if let Some(cpus) = inner.state.get(&uid, &container.name).cloned() {
            Ok(Some(cpus))
        } else {
            self.check_smt(&inner, &uid, n).and_then(|()| self.take_cpus(&inner, &uid, n, affinity)).map(|c| {
                inner.state.default_cpuset = inner.state.default_cpuset.difference(&c);
                inner.state.set(&uid, &container.name, c.clone());
                self.save(&inner.state);
                tracing::info!(pod = %uid, container = %container.name, cpus = %c, "CPU manager: exclusive CPUs allocated");
                Some(c)
            })
        };
        match result.map(Option::unwrap_or_default) {
            Ok(cpus) => {
                Self::update_cpus_to_reuse(&mut inner, pod, &container.name, &cpus);
                Ok(())
            }
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.cpu_manager_pinning_errors.inc();
                }
                Err(e)
            }
        }
    }

    /// `full-pcpus-only`: the request must be whole cores, and that many CPUs must be free
    /// in wholly free cores.
    fn check_smt(&self, inner: &Inner, uid: &str, n: usize) -> Result<(), AllocError> {
        let cpus_per_core = self.topo.cpus_per_core().max(1);
        let reusable = inner.cpus_to_reuse.get(uid).cloned().unwrap_or_default();
        let available = self.available(&inner.state).union(&reusable);
        if self.options.full_pcpus_only {
            if !n.is_multiple_of(cpus_per_core) {
                return Err(AllocError::Smt { requested: n, cpus_per_core, available_physical: None });
            }
            let whole: usize = self
                .topo
                .cpus
                .values()
                .map(|i| i.core)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|c| self.topo.cpus_in_core(c))
                .filter(|c| c.is_subset_of(&available))
                .map(|c| c.len())
                .sum();
            if n > whole {
                return Err(AllocError::Smt { requested: n, cpus_per_core, available_physical: Some(whole) });
            }
        }
        Ok(())
    }

    fn take_cpus(&self, inner: &Inner, uid: &str, n: usize, affinity: Option<NumaMask>) -> Result<CpuSet, AllocError> {
        let reusable = inner.cpus_to_reuse.get(uid).cloned().unwrap_or_default();
        let available = self.available(&inner.state).union(&reusable);
        let mut result = CpuSet::new();
        if let Some(mask) = affinity {
            let nodes = mask.nodes();
            let mut aligned = available.intersection(&self.topo.cpus_in_numa_nodes(&nodes));
            if self.options.align_by_socket {
                let sockets: Vec<usize> = self
                    .topo
                    .cpus_in_numa_nodes(&nodes)
                    .iter()
                    .map(|c| self.topo.cpus[&c].socket)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                aligned = available.intersection(&self.topo.cpus_in_sockets(&sockets));
            }
            let k = aligned.len().min(n);
            result = self.take_by_topology(&aligned, k)?;
        }
        let rest = self.take_by_topology(&available.difference(&result), n - result.len())?;
        Ok(result.union(&rest))
    }

    fn take_by_topology(&self, available: &CpuSet, n: usize) -> Result<CpuSet, AllocError> {
        if n == 0 {
            return Ok(CpuSet::new());
        }
        let r = if self.options.distribute_cpus_across_numa {
            let group = if self.options.full_pcpus_only { self.topo.cpus_per_core() } else { 1 };
            assignment::take_distributed(&self.topo, available, n, group)
        } else {
            assignment::take_packed(&self.topo, available, n)
        };
        r.map_err(AllocError::Take)
    }

    /// Upstream `generateCPUTopologyHints`: one hint per NUMA node combination with
    /// enough CPUs (reusable CPUs must all be inside it), preferred when it is as narrow
    /// as the narrowest combination that could ever hold the request.
    fn generate_hints(&self, available: &CpuSet, reusable: &CpuSet, request: usize) -> Vec<TopologyHint> {
        let nodes = self.topo.numa_nodes();
        let mut min_size = nodes.len();
        let mut hints = Vec::new();
        for mask in crate::cm::topology::iterate_masks(&nodes) {
            let in_mask = self.topo.cpus_in_numa_nodes(&mask.nodes());
            if in_mask.len() >= request && (mask.count() as usize) < min_size {
                min_size = mask.count() as usize;
            }
            if !reusable.is_subset_of(&in_mask) {
                continue;
            }
            let matching = reusable.len() + available.intersection(&in_mask).len();
            if matching >= request {
                hints.push(TopologyHint { affinity: Some(mask), preferred: false });
            }
        }
        for h in &mut hints {
            let Some(mask) = h.affinity else { continue };
            h.preferred = mask.count() as usize == min_size
                || (self.options.align_by_socket && self.is_socket_aligned(mask, min_size));
        }
        hints
    }

    /// `align-by-socket`: a hint is also preferred when its NUMA nodes span exactly as many
    /// sockets as the narrowest hint needs (upstream `isHintSocketAligned`).
    fn is_socket_aligned(&self, mask: NumaMask, min_size: usize) -> bool {
        let per_socket = self.topo.numa_nodes().len() / self.topo.sockets().len().max(1);
        if per_socket == 0 {
            return false;
        }
        let min_sockets = min_size.div_ceil(per_socket);
        let sockets: std::collections::BTreeSet<usize> =
            self.topo.cpus_in_numa_nodes(&mask.nodes()).iter().map(|c| self.topo.cpus[&c].socket).collect();
        sockets.len() == min_sockets
    }

    /// Forgets assignments of containers not in `active` (upstream `removeStaleState`),
    /// returning their CPUs to the shared pool.
    fn remove_stale_locked(inner: &mut Inner, active: &[Pod]) -> bool {
        let (keep, stale) = crate::cm::topology::stale_assignments(&inner.state.assignments, active);
        for (pod, c) in &stale {
            tracing::info!(pod = %pod, container = %c, "CPU manager: removing stale assignment");
            let in_use: CpuSet = inner
                .state
                .assignments
                .get(pod)
                .map(|m| m.iter().filter(|(n, _)| *n != c).fold(CpuSet::new(), |a, (_, s)| a.union(s)))
                .unwrap_or_default();
            if let Some(cpus) = inner.state.get(pod, c).cloned() {
                inner.state.delete(pod, c);
                inner.state.default_cpuset = inner.state.default_cpuset.union(&cpus.difference(&in_use));
            }
        }
        inner.cpus_to_reuse.retain(|u, _| keep.contains_key(u));
        !stale.is_empty()
    }

    /// One reconcile pass: removes stale state (when `active` is known), then returns the
    /// running containers whose cpuset must change as (container id, cpus). `running`
    /// holds (container id, pod UID, container name) of the running containers; only
    /// containers of active pods are updated.
    pub fn reconcile_plan(
        &self,
        active: Option<&[Pod]>,
        running: &[(String, String, String)],
    ) -> Vec<(String, CpuSet)> {
        if !self.is_static {
            return Vec::new();
        }
        let Some(active) = active else { return Vec::new() };
        let mut inner = self.inner.lock().unwrap();
        if Self::remove_stale_locked(&mut inner, active) {
            self.save(&inner.state);
        }
        let active_uids: HashMap<String, &Pod> = active.iter().map(|p| (pod_uid(p).to_owned(), p)).collect();
        let mut plan = Vec::new();
        for (id, pod_uid, name) in running {
            let Some(pod) = active_uids.get(pod_uid) else { continue };
            let known = pod
                .spec
                .as_ref()
                .is_some_and(|s| s.init_containers.iter().flatten().chain(&s.containers).any(|c| c.name == *name));
            if !known {
                continue;
            }
            let want = self.affinity_locked(&inner.state, pod_uid, name);
            if want.is_empty() {
                tracing::warn!(container = %id, "CPU manager: reconcile found an empty cpuset; skipping");
                continue;
            }
            if inner.last_update.get(id) != Some(&want) {
                plan.push((id.clone(), want));
            }
        }
        let running_ids: std::collections::HashSet<&String> = running.iter().map(|(id, _, _)| id).collect();
        inner.last_update.retain(|id, _| running_ids.contains(id));
        plan
    }

    /// Records that `id` now runs on `cpus` (after a successful update).
    pub fn record_update(&self, id: &str, cpus: CpuSet) {
        self.inner.lock().unwrap().last_update.insert(id.to_owned(), cpus);
    }

    /// One reconcile pass against the runtime: lists running containers, updates those
    /// whose cpuset changed.
    pub async fn reconcile(&self, rt: &dyn RuntimeService, active: Option<&[Pod]>) {
        use crate::container::labels;
        let filter = api::ContainerFilter {
            state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
            ..Default::default()
        };
        let containers = match rt.list_containers(Some(filter)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "CPU manager: reconcile cannot list containers");
                return;
            }
        };
        let running: Vec<(String, String, String)> = containers
            .into_iter()
            .filter_map(|c| {
                let uid = c.labels.get(labels::POD_UID)?.clone();
                let name = c.labels.get(labels::CONTAINER_NAME)?.clone();
                Some((c.id, uid, name))
            })
            .collect();
        for (id, cpus) in self.reconcile_plan(active, &running) {
            let resources = api::LinuxContainerResources { cpuset_cpus: cpus.to_string(), ..Default::default() };
            match rt.update_container_resources(&id, resources).await {
                Ok(()) => {
                    tracing::info!(container = %id, cpus = %cpus, "CPU manager: updated container cpuset");
                    self.record_update(&id, cpus);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(container = %id, error = %e, "CPU manager: failed to update container cpuset"),
            }
        }
    }

    /// The reconcile loop: every `cpuManagerReconcilePeriod` until `shutdown` (not run
    /// with the `none` policy, as upstream).
    pub async fn run(self: Arc<Self>, rt: Arc<dyn RuntimeService>, active: ActivePods, shutdown: CancellationToken) {
        if !self.is_static {
            return;
        }
        let mut tick = tokio::time::interval(self.reconcile_period.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => self.reconcile(rt.as_ref(), active().as_deref()).await,
            }
        }
    }
}

/// Why an exclusive allocation failed.
#[derive(Debug)]
enum AllocError {
    Smt { requested: usize, cpus_per_core: usize, available_physical: Option<usize> },
    Take(assignment::Error),
}

impl AllocError {
    fn rejection(&self) -> Rejection {
        match self {
            Self::Smt { requested, cpus_per_core, available_physical: None } => Rejection {
                reason: "SMTAlignmentError".into(),
                message: format!(
                    "SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {cpus_per_core}"
                ),
            },
            Self::Smt { requested, cpus_per_core, available_physical: Some(a) } => Rejection {
                reason: "SMTAlignmentError".into(),
                message: format!(
                    "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {a}, requested CPUs = {requested}, CPUs per core = {cpus_per_core}"
                ),
            },
            Self::Take(e) => Rejection {
                reason: "UnexpectedAdmissionError".into(),
                message: format!("Allocate failed due to {e}, which is unexpected"),
            },
        }
    }
}

/// Upstream `validateState` for the static policy: an empty state starts with every CPU
/// shared; a restored one must keep the reserved CPUs shared, not overlap exclusive and
/// shared CPUs, and cover exactly the machine's CPUs.
fn validate_state(state: &mut CpuState, reserved: &CpuSet, topo: &MachineTopology) -> Result<(), String> {
    let all = topo.all_cpus();
    if state.default_cpuset.is_empty() {
        if !state.assignments.is_empty() {
            return Err("default cpuset cannot be empty".into());
        }
        state.default_cpuset = all;
        return Ok(());
    }
    if !reserved.is_subset_of(&state.default_cpuset) {
        return Err(format!(
            "not all reserved cpus: \"{reserved}\" are present in defaultCpuSet: \"{}\"",
            state.default_cpuset
        ));
    }
    let mut known = state.default_cpuset.clone();
    for (pod, m) in &state.assignments {
        for (c, cpus) in m {
            if !cpus.intersection(&state.default_cpuset).is_empty() {
                return Err(format!(
                    "pod: {pod}, container: {c} cpuset: \"{cpus}\" overlaps with default cpuset \"{}\"",
                    state.default_cpuset
                ));
            }
            known = known.union(cpus);
        }
    }
    if known != all {
        return Err(format!("current set of available CPUs \"{all}\" doesn't match with CPUs in state \"{known}\""));
    }
    Ok(())
}

impl HintProvider for CpuManager {
    fn get_topology_hints(&self, pod: &Pod, container: &Container) -> Hints {
        let mut hints = Hints::new();
        if !self.is_static {
            return hints;
        }
        let request = guaranteed_cpus(pod, container);
        if request == 0 {
            return hints;
        }
        let inner = self.inner.lock().unwrap();
        let uid = pod_uid(pod).to_owned();
        let list = if let Some(allocated) = inner.state.get(&uid, &container.name) {
            if allocated.len() == request {
                self.generate_hints(allocated, &CpuSet::new(), request)
            } else {
                tracing::error!(pod = %uid, container = %container.name, "CPUs already allocated to container with different number than request");
                Vec::new()
            }
        } else {
            let reusable = inner.cpus_to_reuse.get(&uid).cloned().unwrap_or_default();
            self.generate_hints(&self.available(&inner.state), &reusable, request)
        };
        hints.insert(CPU.into(), list);
        hints
    }

    fn get_pod_topology_hints(&self, pod: &Pod) -> Hints {
        let mut hints = Hints::new();
        if !self.is_static {
            return hints;
        }
        let request = pod_guaranteed_cpus(pod);
        if request == 0 {
            return hints;
        }
        let inner = self.inner.lock().unwrap();
        let uid = pod_uid(pod).to_owned();
        let mut assigned = CpuSet::new();
        let spec = pod.spec.as_ref().expect("a pod with guaranteed CPUs has a spec");
        for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
            if let Some(allocated) = inner.state.get(&uid, &c.name) {
                if allocated.len() != guaranteed_cpus(pod, c) {
                    hints.insert(CPU.into(), Vec::new());
                    return hints;
                }
                assigned = assigned.union(allocated);
            }
        }
        let list = if assigned.len() == request {
            self.generate_hints(&assigned, &CpuSet::new(), request)
        } else {
            let reusable = inner.cpus_to_reuse.get(&uid).cloned().unwrap_or_default().union(&assigned);
            self.generate_hints(&self.available(&inner.state), &reusable, request)
        };
        hints.insert(CPU.into(), list);
        hints
    }

    fn allocate(&self, pod: &Pod, container: &Container, affinity: &TopologyHint) -> Result<(), Rejection> {
        if !self.is_static {
            return Ok(());
        }
        self.allocate_static(pod, container, affinity.affinity).map_err(|e| e.rejection())
    }

    fn remove_stale(&self, active: &[Pod]) {
        if !self.is_static {
            return;
        }
        let mut inner = self.inner.lock().unwrap();
        if Self::remove_stale_locked(&mut inner, active) {
            self.save(&inner.state);
        }
    }
}

impl ContainerLifecycleHook for CpuManager {
    fn pre_create_container(
        &self,
        pod: &Pod,
        container: &Container,
        config: &mut api::ContainerConfig,
    ) -> Result<(), String> {
        let (cpus, exclusive) = {
            let inner = self.inner.lock().unwrap();
            let uid = pod_uid(pod).to_owned();
            (
                self.affinity_locked(&inner.state, &uid, &container.name),
                inner.state.get(&uid, &container.name).is_some(),
            )
        };
        if !cpus.is_empty() {
            let linux = config.linux.get_or_insert_with(Default::default);
            let resources = linux.resources.get_or_insert_with(Default::default);
            resources.cpuset_cpus = cpus.to_string();
            // Upstream `DisableCPUQuotaWithExclusiveCPUs`: a container pinned to its own
            // CPUs is not throttled (only where a quota is enforced at all).
            if exclusive && self.no_quota_with_exclusive && resources.cpu_period != 0 {
                resources.cpu_quota = -1;
            }
        }
        Ok(())
    }

    fn pre_start_container(&self, pod: &Pod, container: &Container, container_id: &str) -> Result<(), String> {
        let mut inner = self.inner.lock().unwrap();
        let cpus = self.affinity_locked(&inner.state, pod_uid(pod), &container.name);
        if !cpus.is_empty() {
            inner.last_update.insert(container_id.to_owned(), cpus);
        }
        Ok(())
    }

    fn post_stop_container(&self, container_id: &str) {
        let mut inner = self.inner.lock().unwrap();
        inner.last_update.remove(container_id);
    }
}

#[cfg(test)]
mod tests;
