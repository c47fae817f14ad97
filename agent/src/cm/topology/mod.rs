//! Topology hints (upstream `pkg/kubelet/cm/topologymanager`): NUMA affinity masks and
//! the hint providers (CPU, memory and device managers) the topology manager merges.
//!
//! A provider answers per resource name: no entry means "no preference" (upstream's nil
//! slice), an empty list means "this resource cannot be aligned at all" (upstream's empty
//! slice).
//!
//! [`TopologyManager`] is upstream's manager: policies `none`, `best-effort`, `restricted`
//! and `single-numa-node`, scopes `container` and `pod`, and the policy options
//! `prefer-closest-numa-nodes` and `max-allowable-numa-nodes`. At admission it collects
//! the providers' hints (per container, or once per pod), merges them as upstream's
//! `HintMerger` does (every permutation of one hint per resource, AND-ed; preferred only
//! when every hint is preferred and all affinities are equal; the best by preference,
//! then narrowness or NUMA distance), refuses the pod with `TopologyAffinityError`
//! ("Resources cannot be allocated with Topology locality") when the policy says so, and
//! otherwise has every provider allocate within the chosen affinity. A provider's refusal
//! is the pod's rejection as the provider words it. With `none` no hints are asked for:
//! every container is allocated without affinity.

use std::collections::HashMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::lifecycle::admission::Rejection;

/// A set of NUMA node ids (upstream `bitmask.BitMask`; ids 0..64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NumaMask(pub u64);

impl NumaMask {
    /// The mask of `nodes`; ids of 64 and above are ignored.
    #[must_use]
    pub fn from_nodes(nodes: impl IntoIterator<Item = usize>) -> Self {
        Self(nodes.into_iter().filter(|n| *n < 64).fold(0, |m, n| m | (1 << n)))
    }

    /// The node ids in the mask, ascending.
    #[must_use]
    pub fn nodes(self) -> Vec<usize> {
        (0..64).filter(|n| self.0 & (1 << n) != 0).collect()
    }

    /// How many nodes the mask holds.
    #[must_use]
    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the mask holds node `n`.
    #[must_use]
    pub fn contains(self, n: usize) -> bool {
        n < 64 && self.0 & (1 << n) != 0
    }

    /// The nodes in both masks.
    #[must_use]
    pub fn and(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    /// Upstream `IsNarrowerThan`: fewer nodes, or as many with lower ids.
    #[must_use]
    pub fn is_narrower_than(self, other: Self) -> bool {
        match self.count().cmp(&other.count()) {
            std::cmp::Ordering::Equal => self.0 < other.0,
            o => o == std::cmp::Ordering::Less,
        }
    }
}

/// One way to place a resource (upstream `TopologyHint`): `affinity` `None` means any
/// node will do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TopologyHint {
    pub affinity: Option<NumaMask>,
    pub preferred: bool,
}

/// Hints per resource name (see the module docs for absent vs. empty).
pub type Hints = HashMap<String, Vec<TopologyHint>>;

/// Container names of active pods, by pod UID.
pub type ActiveContainers = HashMap<String, Vec<String>>;

/// What upstream's `removeStaleState` drops: with `assignments` (pod UID → container name →
/// anything), returns the container names of each `active` pod by UID (init containers
/// included) and the (pod UID, container) entries no active pod holds.
#[must_use]
pub fn stale_assignments<V>(
    assignments: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, V>>,
    active: &[Pod],
) -> (ActiveContainers, Vec<(String, String)>) {
    let keep: ActiveContainers = active
        .iter()
        .map(|p| {
            let names = p
                .spec
                .as_ref()
                .map(|s| s.init_containers.iter().flatten().chain(&s.containers).map(|c| c.name.clone()).collect());
            (p.metadata.uid.clone().unwrap_or_default(), names.unwrap_or_default())
        })
        .collect();
    let stale = assignments
        .iter()
        .flat_map(|(pod, m)| m.keys().map(move |c| (pod.clone(), c.clone())))
        .filter(|(pod, c)| !keep.get(pod).is_some_and(|names| names.contains(c)))
        .collect();
    (keep, stale)
}

/// A manager whose resources the topology manager aligns (upstream `HintProvider`).
pub trait HintProvider: Send + Sync + Debug {
    /// Hints for one container (scope `container`).
    fn get_topology_hints(&self, pod: &Pod, container: &Container) -> Hints;

    /// Hints for the whole pod (scope `pod`).
    fn get_pod_topology_hints(&self, pod: &Pod) -> Hints;

    /// Allocates `container`'s resources within `affinity`, the hint the topology
    /// manager chose (`TopologyHint::default()` when no policy aligns). A refusal is the
    /// admission rejection, as upstream (`UnexpectedAdmissionError`, ...).
    ///
    /// # Errors
    /// The rejection when the resources cannot be allocated.
    fn allocate(&self, pod: &Pod, container: &Container, affinity: &TopologyHint) -> Result<(), Rejection>;

    /// Forgets allocations of pods not in `active` (upstream `removeStaleState` /
    /// `UpdateAllocatedDevices`).
    fn remove_stale(&self, _active: &[Pod]) {}
}

mod manager;

pub use manager::{Policy, PolicyOptions, Scope, TopologyManager, TopologyManagerConfig, iterate_masks};
