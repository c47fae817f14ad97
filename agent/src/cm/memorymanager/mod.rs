//! Memory manager (upstream `pkg/kubelet/cm/memorymanager`): policies `None` and `Static`.
//!
//! With `Static`, every container of a Guaranteed pod gets its memory request reserved
//! on a set of NUMA nodes (a "cell" group); the container's `cpuset.mems` is set to those
//! nodes at creation. Each node's allocatable memory is its `MemTotal` minus its
//! `reservedMemory`; the sum of `reservedMemory` must equal kubeReserved plus systemReserved
//! plus the `memory.available` hard eviction threshold, as upstream requires. Hints follow
//! upstream's `calculateHints` (a group of nodes already used together is only offered
//! as that group; a node used alone is never grouped; preferred = the fewest nodes that
//! could ever hold the request). Allocation honours the topology manager's affinity,
//! widening it when it cannot hold the request, as upstream's `extendTopologyManagerHint`.
//! Stale pods are released at admission.
//!
//! State: `<root-dir>/memory_manager_state` in upstream's JSON shape (policyName,
//! machineState, entries, checksum), restored at start; a checkpoint of another policy or
//! a machine state that differs from the machine is a startup error.
//!
//! Huge pages (`hugepages-<size>` requests, the nodes' `nr_hugepages`, `reservedMemory`
//! limits of those types) are managed like `memory`, one block per type.
//!
//! App containers reuse what the pod's finished init containers reserved on the same
//! nodes (the init containers' blocks shrink by what was reused, as upstream). The checksum is
//! upstream's (checked against upstream's test vector); upstream's newer "v3" layout
//! (`data` + `dataChecksum`, pod-level entries) is not read.

use crate::types::pod::uid as pod_uid;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use crate::cm::checkpoint::{Spew, write_atomic};
use crate::cm::container_lifecycle::ContainerLifecycleHook;
use crate::cm::machine_topology::MachineTopology;
use crate::cm::topology::{HintProvider, Hints, NumaMask, TopologyHint, iterate_masks};
use crate::lifecycle::admission::Rejection;
use crate::types::pod_resources;
use crate::types::qos::{QosClass, qos_class};
use crate::types::resource_names::{MEMORY, is_hugepage_resource_name};

/// Name of the checkpoint file in the root dir.
pub const CHECKPOINT_NAME: &str = "memory_manager_state";

/// A memory manager that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration problem (upstream's wording where it has one).
    #[error("[memorymanager] {0}")]
    Config(String),
    /// The checkpoint cannot be read or written.
    #[error("memory manager checkpoint {path}: {reason}")]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// One NUMA node's memory (upstream `MemoryTable`), bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryTable {
    /// `MemTotal` of the node.
    pub total: u64,
    /// `reservedMemory` of the node.
    pub system_reserved: u64,
    /// total − systemReserved.
    pub allocatable: u64,
    /// Reserved for containers.
    pub reserved: u64,
    /// allocatable − reserved.
    pub free: u64,
}

/// One NUMA node's state (upstream `NUMANodeState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    /// Containers with memory on this node.
    pub number_of_assignments: u64,
    /// Memory by resource name (only `memory`).
    pub memory_map: BTreeMap<String, MemoryTable>,
    /// The group of nodes this node is used with (itself when unused).
    pub cells: Vec<usize>,
}

/// A container's reservation (upstream `Block`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Block {
    /// NUMA nodes.
    pub numa_affinity: Vec<usize>,
    /// Resource name (`memory`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Bytes.
    pub size: u64,
}

/// The manager's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryState {
    /// Per NUMA node.
    pub machine: BTreeMap<usize, NodeState>,
    /// pod UID → container → blocks.
    pub assignments: BTreeMap<String, BTreeMap<String, Vec<Block>>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointFile {
    policy_name: String,
    machine_state: BTreeMap<String, NodeState>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: BTreeMap<String, BTreeMap<String, Vec<Block>>>,
    checksum: u64,
}

fn spew_u64(v: u64) -> Spew {
    Spew::scalar("uint64", v)
}

impl CheckpointFile {
    fn checksum(&self) -> u32 {
        let ints = |v: &[usize]| Spew::Slice {
            ty: "[]int".into(),
            items: Some(v.iter().map(|n| Spew::scalar("int", n)).collect()),
        };
        let nodes = self
            .machine_state
            .iter()
            .map(|(id, n)| {
                let mm = n
                    .memory_map
                    .iter()
                    .map(|(k, t)| {
                        let table = Spew::Ptr(Box::new(Spew::Struct {
                            ty: "state.MemoryTable".into(),
                            fields: vec![
                                ("TotalMemSize", spew_u64(t.total)),
                                ("SystemReserved", spew_u64(t.system_reserved)),
                                ("Allocatable", spew_u64(t.allocatable)),
                                ("Reserved", spew_u64(t.reserved)),
                                ("Free", spew_u64(t.free)),
                            ],
                        }));
                        (k.clone(), table)
                    })
                    .collect();
                let node = Spew::Ptr(Box::new(Spew::Struct {
                    ty: "state.NUMANodeState".into(),
                    fields: vec![
                        ("NumberOfAssignments", Spew::scalar("int", n.number_of_assignments)),
                        (
                            "MemoryMap",
                            Spew::Map { ty: "map[v1.ResourceName]*state.MemoryTable".into(), entries: Some(mm) },
                        ),
                        ("Cells", ints(&n.cells)),
                    ],
                }));
                (id.clone(), node)
            })
            .collect();
        let entries = self
            .entries
            .iter()
            .map(|(pod, m)| {
                let inner = m
                    .iter()
                    .map(|(c, blocks)| {
                        let items = blocks
                            .iter()
                            .map(|b| Spew::Struct {
                                ty: "state.Block".into(),
                                fields: vec![
                                    ("NUMAAffinity", ints(&b.numa_affinity)),
                                    ("Type", Spew::scalar("v1.ResourceName", &b.kind)),
                                    ("Size", spew_u64(b.size)),
                                ],
                            })
                            .collect();
                        (c.clone(), Spew::Slice { ty: "[]state.Block".into(), items: Some(items) })
                    })
                    .collect();
                (pod.clone(), Spew::Map { ty: "map[string][]state.Block".into(), entries: Some(inner) })
            })
            .collect();
        Spew::Ptr(Box::new(Spew::Struct {
            ty: "state.MemoryManagerCheckpoint".into(),
            fields: vec![
                ("PolicyName", Spew::string(&self.policy_name)),
                ("MachineState", Spew::Map { ty: "state.NUMANodeMap".into(), entries: Some(nodes) }),
                ("Entries", Spew::Map { ty: "state.ContainerMemoryAssignments".into(), entries: Some(entries) }),
                ("Checksum", Spew::scalar("checksum.Checksum", 0)),
            ],
        }))
        .checksum()
    }
}

/// What the memory manager is built from.
#[derive(Clone, Debug, Default)]
pub struct MemoryManagerConfig {
    /// `memoryManagerPolicy`: `None` or `Static`.
    pub policy: String,
    /// `reservedMemory`: NUMA node → memory type (`memory`, `hugepages-2Mi`, ...) → bytes.
    pub reserved_memory: BTreeMap<usize, Requests>,
    /// Node allocatable's reservation per memory type: for `memory`, kubeReserved +
    /// systemReserved + evictionHard `memory.available` (absolute); for huge pages,
    /// kubeReserved + systemReserved. Bytes.
    pub node_allocatable_reservation: Requests,
}

/// Bytes per memory type (`memory`, `hugepages-<size>`).
pub type Requests = BTreeMap<String, u64>;

fn is_memory_type(name: &str) -> bool {
    name == MEMORY || is_hugepage_resource_name(name)
}

/// The memory manager.
#[derive(Debug)]
pub struct MemoryManager {
    is_static: bool,
    nodes: Vec<usize>,
    path: PathBuf,
    state: Mutex<MemoryState>,
    /// Memory of a pod's finished init containers its app containers may reuse:
    /// (NUMA nodes, type) → bytes (upstream `initContainersReusableMemory`; one pod at a
    /// time, as pods are admitted one by one).
    reusable: Mutex<HashMap<String, Reusable>>,
}

/// Reusable bytes of one pod by (NUMA nodes, type).
type Reusable = HashMap<(Vec<usize>, String), u64>;

/// A plain init container (not a sidecar): its memory is free again once it is done.
fn is_plain_init_container(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|v| v.iter().any(|c| c.name == name && !pod_resources::is_restartable_init_container(c)))
}

/// Kubernetes quantity text of a byte count (binary suffix when exact).
fn bytes_text(b: u64) -> String {
    for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if b != 0 && b.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", b >> shift);
        }
    }
    b.to_string()
}

/// The container's memory and huge page requests when the pod is Guaranteed, else
/// `None` (upstream `getRequestedResources`).
fn requested_memory(pod: &Pod, container: &Container) -> Option<Requests> {
    if qos_class(pod) != QosClass::Guaranteed {
        return None;
    }
    let r: Requests = pod_resources::container_requests(container)
        .into_iter()
        .filter(|(name, _)| is_memory_type(name))
        .filter_map(|(name, q)| Some((name, q.value().filter(|v| *v > 0)? as u64)))
        .collect();
    Some(r).filter(|r| !r.is_empty())
}

/// The pod's memory as upstream's memory manager sums it, per type (sidecars run next
/// to the app containers; a plain init container next to the sidecars started before it).
fn pod_requested_memory(pod: &Pod) -> Option<Requests> {
    let spec = pod.spec.as_ref()?;
    let add = |into: &mut Requests, r: &Requests| {
        for (k, v) in r {
            *into.entry(k.clone()).or_default() += v;
        }
    };
    let (mut init, mut sidecars) = (Requests::new(), Requests::new());
    for c in spec.init_containers.iter().flatten() {
        let r = requested_memory(pod, c).unwrap_or_default();
        if pod_resources::is_restartable_init_container(c) {
            add(&mut sidecars, &r);
        } else {
            let mut with = sidecars.clone();
            add(&mut with, &r);
            for (k, v) in with {
                let e = init.entry(k).or_default();
                *e = (*e).max(v);
            }
        }
    }
    let mut long_running = sidecars;
    for c in &spec.containers {
        add(&mut long_running, &requested_memory(pod, c).unwrap_or_default());
    }
    for (k, v) in init {
        let e = long_running.entry(k).or_default();
        *e = (*e).max(v);
    }
    long_running.retain(|_, v| *v > 0);
    Some(long_running).filter(|r| !r.is_empty())
}

impl MemoryManager {
    /// Builds the manager and restores `<root_dir>/memory_manager_state`.
    ///
    /// # Errors
    /// Upstream's startup errors: reservedMemory not matching node allocatable, naming a
    /// node that does not exist or reserving more than a node has; a checkpoint of another
    /// policy or one that contradicts the machine.
    pub fn new(cfg: &MemoryManagerConfig, topo: &MachineTopology, root_dir: &Path) -> Result<Self, Error> {
        let is_static = match cfg.policy.as_str() {
            "" | "None" => false,
            "Static" => true,
            other => return Err(Error::Config(format!("unknown policy: \"{other}\""))),
        };
        let nodes = topo.numa_nodes();
        let path = root_dir.join(CHECKPOINT_NAME);
        let mut machine = BTreeMap::new();
        if is_static {
            let mut totals = Requests::new();
            for per_type in cfg.reserved_memory.values() {
                for (k, v) in per_type {
                    *totals.entry(k.clone()).or_default() += v;
                }
            }
            let types: std::collections::BTreeSet<&String> =
                totals.keys().chain(cfg.node_allocatable_reservation.keys().filter(|k| is_memory_type(k))).collect();
            for kind in types {
                let (reserved, wanted) = (
                    totals.get(kind).copied().unwrap_or(0),
                    cfg.node_allocatable_reservation.get(kind).copied().unwrap_or(0),
                );
                if reserved != wanted {
                    return Err(Error::Config(format!(
                        "the total amount {:?} of type {kind:?} is not equal to the value {:?} determined by Node Allocatable feature",
                        bytes_text(reserved),
                        bytes_text(wanted)
                    )));
                }
            }
            if totals.get(MEMORY).copied().unwrap_or(0) == 0 {
                return Err(Error::Config("you should specify the system reserved memory".into()));
            }
            for (node, per_type) in &cfg.reserved_memory {
                if !nodes.contains(node) {
                    return Err(Error::Config(format!(
                        "reservedMemory: NUMA node {node} does not exist on this machine"
                    )));
                }
                for (kind, bytes) in per_type {
                    let have = topo.memory_of(*node, kind);
                    if *bytes > have {
                        return Err(Error::Config(format!(
                            "kubelet config reserves {bytes} bytes of {kind} on NUMA node {node}, which only has {have}"
                        )));
                    }
                }
            }
            for n in &nodes {
                let mut memory_map = BTreeMap::new();
                for kind in topo.memory_types(*n) {
                    let total = topo.memory_of(*n, &kind);
                    let reserved = cfg.reserved_memory.get(n).and_then(|r| r.get(&kind)).copied().unwrap_or(0);
                    let alloc = total - reserved;
                    let table =
                        MemoryTable { total, system_reserved: reserved, allocatable: alloc, reserved: 0, free: alloc };
                    memory_map.insert(kind, table);
                }
                machine.insert(*n, NodeState { number_of_assignments: 0, memory_map, cells: vec![*n] });
            }
        }
        let policy_name = if is_static { "Static" } else { "None" };
        let state = match std::fs::read(&path) {
            Ok(text) => {
                let bad = |reason: String| Error::State { path: path.clone(), reason };
                let file: CheckpointFile = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
                if file.checksum != 0 && file.checksum != u64::from(file.checksum()) {
                    return Err(bad("checkpoint is corrupted".into()));
                }
                if file.policy_name != policy_name {
                    return Err(bad(format!(
                        "could not restore state from checkpoint: configured policy {policy_name:?} differs from state checkpoint policy {:?}, please drain this node and delete the memory manager checkpoint file \"{}\" before restarting Kubelet",
                        file.policy_name,
                        path.display()
                    )));
                }
                let restored: BTreeMap<usize, NodeState> =
                    file.machine_state.into_iter().filter_map(|(k, v)| Some((k.parse().ok()?, v))).collect();
                let state = MemoryState { machine: restored, assignments: file.entries };
                if is_static && !state.machine.is_empty() {
                    validate(&state, &machine).map_err(|r| bad(format!("[memorymanager] {r}")))?;
                }
                if state.machine.is_empty() { MemoryState { machine, assignments: state.assignments } } else { state }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => MemoryState { machine, assignments: BTreeMap::new() },
            Err(e) => return Err(Error::State { path, reason: e.to_string() }),
        };
        let m = Self { is_static, nodes, path, state: Mutex::new(state), reusable: Mutex::default() };
        m.save(&m.state.lock().unwrap(), policy_name);
        Ok(m)
    }

    /// A copy of the state.
    #[must_use]
    pub fn state(&self) -> MemoryState {
        self.state.lock().unwrap().clone()
    }

    fn save(&self, s: &MemoryState, policy: &str) {
        let mut file = CheckpointFile {
            policy_name: policy.into(),
            machine_state: s.machine.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            entries: s.assignments.clone(),
            checksum: 0,
        };
        file.checksum = u64::from(file.checksum());
        let written =
            serde_json::to_vec(&file).map_err(std::io::Error::from).and_then(|j| write_atomic(&self.path, &j));
        if let Err(e) = written {
            tracing::error!(path = %self.path.display(), error = %e, "memory manager: writing the checkpoint failed");
        }
    }

    /// The NUMA nodes of a container's memory (empty when it has none).
    #[must_use]
    pub fn memory_numa_nodes(&self, pod_uid: &str, container: &str) -> Vec<usize> {
        let s = self.state.lock().unwrap();
        let mut v: Vec<usize> = s
            .assignments
            .get(pod_uid)
            .and_then(|m| m.get(container))
            .map(|b| b.iter().flat_map(|b| b.numa_affinity.iter().copied()).collect())
            .unwrap_or_default();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Bytes of `kind` the pod's init containers left on exactly `nodes`.
    fn reusable(&self, pod_uid: &str, nodes: &[usize], kind: &str) -> u64 {
        let r = self.reusable.lock().unwrap();
        r.get(pod_uid).and_then(|m| m.get(&(nodes.to_vec(), kind.to_owned()))).copied().unwrap_or(0)
    }

    /// Upstream `updatePodReusableMemory`: an init container's blocks become reusable, an
    /// app container's blocks use them up.
    fn update_reusable(&self, pod: &Pod, container: &str, blocks: &[Block]) {
        let uid = pod_uid(pod).to_owned();
        let mut r = self.reusable.lock().unwrap();
        r.retain(|u, _| *u == uid);
        let entry = r.entry(uid).or_default();
        let init = is_plain_init_container(pod, container);
        for b in blocks {
            let slot = entry.entry((b.numa_affinity.clone(), b.kind.clone())).or_default();
            *slot = if init { (*slot).max(b.size) } else { slot.saturating_sub(b.size) };
        }
    }

    /// Upstream `calculateHints`: the node groups that can hold every requested type
    /// (counting what the pod's init containers leave behind on that group).
    /// Hints per memory kind: where `assigned` already is (a re-admission), else every
    /// kind requested gets the computed hints.
    fn hints_for(&self, s: &MemoryState, pod_uid: &str, assigned: &[&Block], requests: &Requests) -> Hints {
        let mut hints = Hints::new();
        if !assigned.is_empty() {
            for b in assigned {
                let mask = NumaMask::from_nodes(b.numa_affinity.iter().copied());
                hints.insert(b.kind.clone(), vec![TopologyHint { affinity: Some(mask), preferred: true }]);
            }
            return hints;
        }
        let list = self.calculate_hints(s, pod_uid, requests);
        for kind in requests.keys() {
            hints.insert(kind.clone(), list.clone());
        }
        hints
    }

    fn calculate_hints(&self, s: &MemoryState, pod_uid: &str, requests: &Requests) -> Vec<TopologyHint> {
        let mut min_size = self.nodes.len() as u32;
        let mut hints = Vec::new();
        'masks: for mask in iterate_masks(&self.nodes) {
            let bits = mask.nodes();
            let single = bits.len() == 1;
            let (mut free, mut alloc) = (Requests::new(), Requests::new());
            for n in &bits {
                let Some(st) = s.machine.get(n) else { continue 'masks };
                if single && st.cells.len() > 1 {
                    continue 'masks;
                }
                if !single && st.number_of_assignments > 0 && (st.cells.len() == 1 || st.cells != bits) {
                    continue 'masks;
                }
                for kind in requests.keys() {
                    let t = st.memory_map.get(kind).cloned().unwrap_or_default();
                    *free.entry(kind.clone()).or_default() += t.free;
                    *alloc.entry(kind.clone()).or_default() += t.allocatable;
                }
            }
            if requests.iter().any(|(k, v)| alloc.get(k).copied().unwrap_or(0) < *v) {
                continue;
            }
            min_size = min_size.min(mask.count());
            if requests.iter().any(|(k, v)| free.get(k).copied().unwrap_or(0) + self.reusable(pod_uid, &bits, k) < *v) {
                continue;
            }
            hints.push(TopologyHint { affinity: Some(mask), preferred: false });
        }
        for h in &mut hints {
            h.preferred = h.affinity.is_some_and(|m| m.count() == min_size);
        }
        hints
    }

    fn best_hint(hints: &[TopologyHint]) -> Option<TopologyHint> {
        let mut best: Option<TopologyHint> = None;
        for h in hints {
            best = match best {
                None => Some(*h),
                Some(b) if h.preferred && !b.preferred => Some(*h),
                Some(b)
                    if h.preferred == b.preferred
                        && h.affinity.unwrap_or_default().is_narrower_than(b.affinity.unwrap_or_default()) =>
                {
                    Some(*h)
                }
                b => b,
            };
        }
        best
    }

    fn allocate_static(&self, pod: &Pod, container: &Container, hint: &TopologyHint) -> Result<(), String> {
        let Some(requests) = requested_memory(pod, container) else { return Ok(()) };
        let mut s = self.state.lock().unwrap();
        let uid = pod_uid(pod).to_owned();
        if let Some(blocks) = s.assignments.get(&uid).and_then(|m| m.get(&container.name)).cloned() {
            self.update_reusable(pod, &container.name, &blocks);
            return Ok(());
        }
        let mut best = *hint;
        if best.affinity.is_none() {
            let default = Self::best_hint(&self.calculate_hints(&s, &uid, &requests)).ok_or_else(|| {
                "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
                    .to_owned()
            })?;
            if !default.preferred && best.preferred {
                return Err("[memorymanager] failed to find the default preferred hint".into());
            }
            best = default;
        }
        let mask = best.affinity.unwrap_or_default();
        let free_in = |m: NumaMask, kind: &str| -> u64 {
            let free: u64 =
                m.nodes().iter().filter_map(|n| s.machine.get(n)?.memory_map.get(kind)).map(|t| t.free).sum();
            free + self.reusable(&uid, &m.nodes(), kind)
        };
        if requests.iter().any(|(k, v)| free_in(mask, k) < *v) {
            // Upstream extendTopologyManagerHint: the best hint that contains the mask.
            let wider: Vec<TopologyHint> = self
                .calculate_hints(&s, &uid, &requests)
                .into_iter()
                .filter(|h| h.affinity.is_some_and(|a| a.and(mask) == mask))
                .collect();
            let ext = Self::best_hint(&wider).ok_or_else(|| {
                "[memorymanager] failed to find NUMA nodes to extend the current topology hint".to_owned()
            })?;
            if !ext.preferred && best.preferred {
                return Err("[memorymanager] failed to find the extended preferred hint".into());
            }
            best = ext;
        }
        let bits = best.affinity.unwrap_or_default().nodes();
        let mut blocks = Vec::new();
        // One block per type; every node of the group counts one assignment per type,
        // as upstream.
        for (kind, size) in &requests {
            // What the pod's finished init containers hold on these nodes is reused.
            let mut left = size.saturating_sub(self.reusable(&uid, &bits, kind));
            for n in &bits {
                let Some(st) = s.machine.get_mut(n) else { continue };
                st.number_of_assignments += 1;
                st.cells.clone_from(&bits);
                let Some(t) = st.memory_map.get_mut(kind) else { continue };
                let take = left.min(t.free);
                t.reserved += take;
                t.free -= take;
                left -= take;
            }
            blocks.push(Block { numa_affinity: bits.clone(), kind: kind.clone(), size: *size });
        }
        self.update_reusable(pod, &container.name, &blocks);
        // Upstream updateInitContainersMemoryBlocks: shrink the earlier init containers'
        // blocks by what was reused, so that the pod's blocks add up to what is reserved.
        if let Some(spec) = pod.spec.as_ref() {
            for b in &blocks {
                let mut reused = b.size;
                for init in spec.init_containers.iter().flatten() {
                    if init.name == container.name || reused == 0 {
                        break;
                    }
                    if pod_resources::is_restartable_init_container(init) {
                        continue;
                    }
                    let Some(init_blocks) = s.assignments.get_mut(&uid).and_then(|m| m.get_mut(&init.name)) else {
                        continue;
                    };
                    for ib in
                        init_blocks.iter_mut().filter(|ib| ib.kind == b.kind && ib.numa_affinity == b.numa_affinity)
                    {
                        let cut = ib.size.min(reused);
                        ib.size -= cut;
                        reused -= cut;
                    }
                }
            }
        }
        s.assignments.entry(uid).or_default().insert(container.name.clone(), blocks);
        self.save(&s, "Static");
        Ok(())
    }

    fn release(s: &mut MemoryState, pod: &str, container: &str) {
        let Some(blocks) = s.assignments.get_mut(pod).and_then(|m| m.remove(container)) else { return };
        if s.assignments.get(pod).is_some_and(BTreeMap::is_empty) {
            s.assignments.remove(pod);
        }
        for b in blocks {
            let mut left = b.size;
            for n in &b.numa_affinity {
                let Some(st) = s.machine.get_mut(n) else { continue };
                st.number_of_assignments = st.number_of_assignments.saturating_sub(1);
                if st.number_of_assignments == 0 {
                    st.cells = vec![*n];
                }
                let Some(t) = st.memory_map.get_mut(&b.kind) else { continue };
                let back = left.min(t.reserved);
                t.reserved -= back;
                t.free += back;
                left -= back;
            }
        }
    }
}

/// The restored machine state must describe the same machine (totals, reservations,
/// allocatable) and account exactly for the restored assignments.
fn validate(s: &MemoryState, expected: &BTreeMap<usize, NodeState>) -> Result<(), String> {
    let mut reserved: HashMap<(usize, String), u64> = HashMap::new();
    for blocks in s.assignments.values().flat_map(BTreeMap::values) {
        for b in blocks {
            // Attribute a block to its nodes in order, as allocation fills them.
            let mut left = b.size;
            for n in &b.numa_affinity {
                let cap = expected.get(n).and_then(|st| st.memory_map.get(&b.kind)).map_or(0, |t| t.allocatable);
                let used = reserved.entry((*n, b.kind.clone())).or_default();
                let take = left.min(cap.saturating_sub(*used));
                *used += take;
                left -= take;
            }
        }
    }
    for (n, want) in expected {
        let Some(got) = s.machine.get(n) else { return Err(format!("NUMA node {n} is missing from the state")) };
        if got.memory_map.keys().ne(want.memory_map.keys()) {
            return Err("the expected machine state is different from the real one".into());
        }
        for (kind, w) in &want.memory_map {
            let g = &got.memory_map[kind];
            if (w.total, w.system_reserved, w.allocatable) != (g.total, g.system_reserved, g.allocatable)
                || g.reserved != reserved.get(&(*n, kind.clone())).copied().unwrap_or(0)
            {
                return Err("the expected machine state is different from the real one".into());
            }
        }
    }
    Ok(())
}

impl HintProvider for MemoryManager {
    fn get_topology_hints(&self, pod: &Pod, container: &Container) -> Hints {
        if !self.is_static {
            return Hints::new();
        }
        let Some(requests) = requested_memory(pod, container) else { return Hints::new() };
        let s = self.state.lock().unwrap();
        let assigned: Vec<&Block> =
            s.assignments.get(pod_uid(pod)).and_then(|m| m.get(&container.name)).into_iter().flatten().collect();
        self.hints_for(&s, pod_uid(pod), &assigned, &requests)
    }

    fn get_pod_topology_hints(&self, pod: &Pod) -> Hints {
        if !self.is_static || qos_class(pod) != QosClass::Guaranteed {
            return Hints::new();
        }
        let Some(requests) = pod_requested_memory(pod) else { return Hints::new() };
        let s = self.state.lock().unwrap();
        let assigned: Vec<&Block> =
            s.assignments.get(pod_uid(pod)).map(|m| m.values().flatten().collect()).unwrap_or_default();
        self.hints_for(&s, pod_uid(pod), &assigned, &requests)
    }

    fn allocate(&self, pod: &Pod, container: &Container, affinity: &TopologyHint) -> Result<(), Rejection> {
        if !self.is_static {
            return Ok(());
        }
        self.allocate_static(pod, container, affinity).map_err(|e| Rejection {
            reason: "UnexpectedAdmissionError".into(),
            message: format!("Allocate failed due to {e}, which is unexpected"),
        })
    }

    fn remove_stale(&self, active: &[Pod]) {
        if !self.is_static {
            return;
        }
        let mut s = self.state.lock().unwrap();
        let (keep, stale) = crate::cm::topology::stale_assignments(&s.assignments, active);
        for (p, c) in &stale {
            Self::release(&mut s, p, c);
        }
        self.reusable.lock().unwrap().retain(|u, _| keep.contains_key(u));
        if !stale.is_empty() {
            self.save(&s, "Static");
        }
    }
}

impl ContainerLifecycleHook for MemoryManager {
    fn pre_create_container(
        &self,
        pod: &Pod,
        container: &Container,
        config: &mut api::ContainerConfig,
    ) -> Result<(), String> {
        let nodes = self.memory_numa_nodes(pod_uid(pod), &container.name);
        if !nodes.is_empty() {
            let text: Vec<String> = nodes.iter().map(ToString::to_string).collect();
            let linux = config.linux.get_or_insert_with(Default::default);
            linux.resources.get_or_insert_with(Default::default).cpuset_mems = text.join(",");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
