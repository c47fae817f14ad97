//! The topology manager proper: policies, scopes, hint merging and admission (upstream
//! `topology_manager.go`, `policy*.go`, `scope*.go`, `numa_info.go`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{HintProvider, Hints, NumaMask, TopologyHint};
use crate::cm::machine_topology::MachineTopology;
use crate::cm::metrics::ResourceManagerMetrics;
use crate::lifecycle::admission::Rejection;

/// Upstream's default `max-allowable-numa-nodes`.
const DEFAULT_MAX_NUMA_NODES: usize = 8;

/// A topology manager policy (`topologyManagerPolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// `none`: no alignment.
    #[default]
    None,
    /// `best-effort`: align when possible, admit anyway.
    BestEffort,
    /// `restricted`: admit only with a preferred merged hint.
    Restricted,
    /// `single-numa-node`: admit only when everything fits one NUMA node.
    SingleNumaNode,
}

/// A topology manager scope (`topologyManagerScope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// `container`: one alignment per container.
    #[default]
    Container,
    /// `pod`: one alignment for the whole pod.
    Pod,
}

/// Policy options (`topologyManagerPolicyOptions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyOptions {
    /// `prefer-closest-numa-nodes`: among equally wide affinities, the one with the
    /// shortest average NUMA distance wins (not for `single-numa-node`).
    pub prefer_closest_numa: bool,
    /// `max-allowable-numa-nodes`: refuse to start on machines with more NUMA nodes.
    /// Default 8.
    pub max_allowable_numa_nodes: usize,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self { prefer_closest_numa: false, max_allowable_numa_nodes: DEFAULT_MAX_NUMA_NODES }
    }
}

/// What the topology manager is built from (the `KubeletConfiguration` fields).
#[derive(Clone, Debug, Default)]
pub struct TopologyManagerConfig {
    /// `topologyManagerPolicy`.
    pub policy: String,
    /// `topologyManagerScope`.
    pub scope: String,
    /// `topologyManagerPolicyOptions`.
    pub options: BTreeMap<String, String>,
    /// `featureGates`.
    pub feature_gates: BTreeMap<String, bool>,
}

/// Whether every pod source has delivered its pods (upstream `sourcesReady`).
pub type SourcesReady = Box<dyn Fn() -> bool + Send + Sync>;

/// The topology manager (see the module docs of [`super`]).
#[derive(Default)]
pub struct TopologyManager {
    providers: Vec<Arc<dyn HintProvider>>,
    policy: Policy,
    scope: Scope,
    options: PolicyOptions,
    numa_nodes: Vec<usize>,
    /// Distances by node id pair.
    distances: BTreeMap<(usize, usize), u64>,
    metrics: Option<Arc<ResourceManagerMetrics>>,
    /// The affinity chosen per (pod UID, container name), upstream's hint store.
    chosen: Mutex<HashMap<(String, String), TopologyHint>>,
    /// Until every source has delivered its pods, no allocation is stale (a pod not
    /// yet seen again after a restart keeps its CPUs), as upstream's `removeStaleState`.
    /// Unset (a manager outside the agent, e.g. in tests) means ready.
    sources_ready: std::sync::OnceLock<SourcesReady>,
}

impl std::fmt::Debug for TopologyManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopologyManager")
            .field("policy", &self.policy)
            .field("scope", &self.scope)
            .field("options", &self.options)
            .field("providers", &self.providers)
            .finish_non_exhaustive()
    }
}

impl TopologyManager {
    /// Builds the manager for `topo` (upstream `NewManager`).
    ///
    /// # Errors
    /// Upstream's messages: unknown policy, scope or option, a bad option value, more
    /// NUMA nodes than `max-allowable-numa-nodes`.
    pub fn new(
        cfg: &TopologyManagerConfig,
        topo: &MachineTopology,
        metrics: Option<Arc<ResourceManagerMetrics>>,
    ) -> Result<Self, String> {
        let policy = match cfg.policy.as_str() {
            "" | "none" => Policy::None,
            "best-effort" => Policy::BestEffort,
            "restricted" => Policy::Restricted,
            "single-numa-node" => Policy::SingleNumaNode,
            other => return Err(format!("unknown policy: \"{other}\"")),
        };
        let scope = match cfg.scope.as_str() {
            "" | "container" => Scope::Container,
            "pod" => Scope::Pod,
            other => return Err(format!("unknown scope: \"{other}\"")),
        };
        let options = parse_options(&cfg.options, &cfg.feature_gates)?;
        let numa_nodes = topo.numa_nodes();
        if policy != Policy::None && numa_nodes.len() > options.max_allowable_numa_nodes {
            return Err(format!(
                "unsupported on machines with more than {} NUMA Nodes",
                options.max_allowable_numa_nodes
            ));
        }
        let mut distances = BTreeMap::new();
        for a in &numa_nodes {
            for b in &numa_nodes {
                distances.insert((*a, *b), topo.distance(*a, *b));
            }
        }
        tracing::info!(?policy, ?scope, ?options, "topology manager created");
        Ok(Self {
            providers: Vec::new(),
            policy,
            scope,
            options,
            numa_nodes,
            distances,
            metrics,
            chosen: Mutex::default(),
            sources_ready: std::sync::OnceLock::new(),
        })
    }

    /// Tells the manager how to know that every pod source has delivered its pods; while
    /// it says no, admission removes no stale allocations. Set once, before admitting.
    pub fn set_sources_ready(&self, ready: SourcesReady) {
        let _ = self.sources_ready.set(ready);
    }

    /// Adds a hint provider (CPU, memory, device manager).
    pub fn add_hint_provider(&mut self, p: Arc<dyn HintProvider>) {
        self.providers.push(p);
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The affinity chosen for a container at admission (upstream `GetAffinity`).
    #[must_use]
    pub fn affinity(&self, pod_uid: &str, container: &str) -> TopologyHint {
        self.chosen.lock().unwrap().get(&(pod_uid.to_owned(), container.to_owned())).copied().unwrap_or_default()
    }

    fn default_mask(&self) -> NumaMask {
        NumaMask::from_nodes(self.numa_nodes.iter().copied())
    }

    /// Merges the providers' hints under the policy: the best hint and whether the pod
    /// may be admitted (upstream `Policy.Merge`).
    #[must_use]
    pub fn merge(&self, providers_hints: &[Hints]) -> (TopologyHint, bool) {
        let filtered = filter_providers_hints(providers_hints);
        match self.policy {
            Policy::None => (TopologyHint::default(), true),
            Policy::BestEffort => (self.merge_filtered(&filtered), true),
            Policy::Restricted => {
                let best = self.merge_filtered(&filtered);
                (best, best.preferred)
            }
            Policy::SingleNumaNode => {
                let single: Vec<Vec<TopologyHint>> = filtered
                    .iter()
                    .map(|hints| {
                        hints
                            .iter()
                            .filter(|h| h.preferred && h.affinity.is_none_or(|m| m.count() == 1))
                            .copied()
                            .collect()
                    })
                    .collect();
                let mut best = self.merge_filtered(&single);
                if best.affinity == Some(self.default_mask()) {
                    best.affinity = None;
                }
                (best, best.preferred)
            }
        }
    }

    fn merge_filtered(&self, hints: &[Vec<TopologyHint>]) -> TopologyHint {
        let default = self.default_mask();
        let best_non_preferred = max_of_min_affinity_counts(hints);
        let mut best: Option<TopologyHint> = None;
        iterate_permutations(hints, &mut Vec::new(), &mut |perm| {
            let candidate = merge_permutation(default, perm);
            best = self.compare(best, candidate, best_non_preferred);
        });
        best.unwrap_or(TopologyHint { affinity: Some(default), preferred: false })
    }

    /// Upstream `HintMerger.compare`.
    fn compare(&self, current: Option<TopologyHint>, candidate: TopologyHint, best_np: u32) -> Option<TopologyHint> {
        let cand_mask = candidate.affinity.unwrap_or_default();
        if cand_mask.count() == 0 {
            return current;
        }
        let Some(cur) = current else { return Some(candidate) };
        let cur_mask = cur.affinity.unwrap_or_default();
        let fitter = || Some(if self.fitter(cur_mask, cand_mask) == cur_mask { cur } else { candidate });
        match (cur.preferred, candidate.preferred) {
            (false, true) => return Some(candidate),
            (true, false) => return Some(cur),
            (true, true) => return fitter(),
            (false, false) => {}
        }
        let (cc, kc) = (cur_mask.count(), cand_mask.count());
        if cc > best_np {
            return fitter();
        }
        if cc == best_np {
            return if kc == best_np { fitter() } else { Some(cur) };
        }
        if kc > best_np {
            return Some(cur);
        }
        if kc == best_np {
            return Some(candidate);
        }
        match kc.cmp(&cc) {
            std::cmp::Ordering::Greater => Some(candidate),
            std::cmp::Ordering::Less => Some(cur),
            std::cmp::Ordering::Equal => fitter(),
        }
    }

    /// The better of two masks: the same mask keeps the current one; else the narrowest,
    /// or with `prefer-closest-numa-nodes` (not under `single-numa-node`) among equally
    /// wide ones the one with the shortest average distance.
    fn fitter(&self, current: NumaMask, candidate: NumaMask) -> NumaMask {
        if current == candidate {
            return current;
        }
        let narrowest = |a: NumaMask, b: NumaMask| if a.is_narrower_than(b) { a } else { b };
        if self.policy == Policy::SingleNumaNode
            || !self.options.prefer_closest_numa
            || current.count() != candidate.count()
        {
            return narrowest(current, candidate);
        }
        let (dc, dk) = (self.average_distance(current), self.average_distance(candidate));
        if (dc - dk).abs() < f64::EPSILON {
            return if current.0 < candidate.0 { current } else { candidate };
        }
        if dc < dk { current } else { candidate }
    }

    fn average_distance(&self, mask: NumaMask) -> f64 {
        let nodes = mask.nodes();
        if nodes.is_empty() {
            return 0.0;
        }
        let mut sum = 0.0;
        for a in &nodes {
            for b in &nodes {
                sum += self.distances.get(&(*a, *b)).copied().unwrap_or(0) as f64;
            }
        }
        sum / (nodes.len() * nodes.len()) as f64
    }

    fn affinity_error() -> Rejection {
        Rejection {
            reason: "TopologyAffinityError".into(),
            message: "Resources cannot be allocated with Topology locality".into(),
        }
    }

    fn allocate_all(&self, pod: &Pod, container: &Container, hint: &TopologyHint) -> Result<(), Rejection> {
        for p in &self.providers {
            p.allocate(pod, container, hint)?;
        }
        Ok(())
    }

    fn remember(&self, pod: &Pod, container: &Container, hint: TopologyHint) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.chosen.lock().unwrap().insert((uid, container.name.clone()), hint);
    }

    fn admit_pod(&self, pod: &Pod) -> Result<(), Rejection> {
        let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
        let containers: Vec<&Container> = spec.init_containers.iter().flatten().chain(&spec.containers).collect();
        if self.policy == Policy::None {
            for c in containers {
                self.allocate_all(pod, c, &TopologyHint::default())?;
            }
            return Ok(());
        }
        match self.scope {
            Scope::Container => {
                for c in containers {
                    let hints: Vec<Hints> = self.providers.iter().map(|p| p.get_topology_hints(pod, c)).collect();
                    let (best, admit) = self.merge(&hints);
                    tracing::debug!(container = %c.name, ?best, admit, "topology manager: merged hints");
                    if !admit {
                        return Err(Self::affinity_error());
                    }
                    self.remember(pod, c, best);
                    self.allocate_all(pod, c, &best)?;
                }
            }
            Scope::Pod => {
                let hints: Vec<Hints> = self.providers.iter().map(|p| p.get_pod_topology_hints(pod)).collect();
                let (best, admit) = self.merge(&hints);
                tracing::debug!(?best, admit, "topology manager: merged pod hints");
                if !admit {
                    return Err(Self::affinity_error());
                }
                for c in containers {
                    self.remember(pod, c, best);
                    self.allocate_all(pod, c, &best)?;
                }
            }
        }
        Ok(())
    }
}

impl crate::lifecycle::admission::PodAdmitHandler for TopologyManager {
    fn admit(&self, pod: &Pod, active: &[Pod]) -> Result<(), Rejection> {
        // The pod being admitted is active too (upstream adds it to the pod manager
        // first): a re-admission after a restart keeps its allocation.
        if self.sources_ready.get().is_none_or(|ready| ready()) {
            let mut live = active.to_vec();
            live.push(pod.clone());
            for p in &self.providers {
                p.remove_stale(&live);
            }
        }
        {
            let live: std::collections::HashSet<&str> =
                active.iter().chain(std::iter::once(pod)).filter_map(|p| p.metadata.uid.as_deref()).collect();
            self.chosen.lock().unwrap().retain(|(uid, _), _| live.contains(uid.as_str()));
        }
        if let Some(m) = &self.metrics {
            m.topology_manager_admission_requests.inc();
        }
        let start = std::time::Instant::now();
        let result = self.admit_pod(pod);
        if let Some(m) = &self.metrics {
            m.topology_manager_admission_duration.observe(start.elapsed().as_millis() as f64);
            if result.is_err() {
                m.topology_manager_admission_errors.inc();
            }
        }
        result
    }
}

fn parse_options(options: &BTreeMap<String, String>, gates: &BTreeMap<String, bool>) -> Result<PolicyOptions, String> {
    let gate = |name: &str, default: bool| gates.get(name).copied().unwrap_or(default);
    let mut o = PolicyOptions::default();
    for (name, value) in options {
        match name.as_str() {
            "prefer-closest-numa-nodes" => {
                o.prefer_closest_numa =
                    value.trim().parse::<bool>().map_err(|e| format!("bad value for option {name:?}: {e}"))?;
            }
            "max-allowable-numa-nodes" => {
                let n = value.trim().parse::<usize>().map_err(|e| format!("bad value for option {name:?}: {e}"))?;
                if n < DEFAULT_MAX_NUMA_NODES {
                    return Err(format!(
                        "the minimum value of {name:?} should not be less than {DEFAULT_MAX_NUMA_NODES}, got {n}"
                    ));
                }
                o.max_allowable_numa_nodes = n;
            }
            _ => return Err(format!("unknown Topology Manager Policy option: {name:?}")),
        }
        if !gate("TopologyManagerPolicyOptions", true) {
            return Err(format!("Topology Manager Policy options not enabled, but option {name:?} provided"));
        }
    }
    Ok(o)
}

/// Upstream `filterProvidersHints`: one list per (provider, resource); a provider
/// without hints or a resource without preference is one preferred any-node hint; a
/// resource that cannot be aligned is one non-preferred any-node hint.
fn filter_providers_hints(providers: &[Hints]) -> Vec<Vec<TopologyHint>> {
    let mut out = Vec::new();
    for hints in providers {
        if hints.is_empty() {
            out.push(vec![TopologyHint { affinity: None, preferred: true }]);
            continue;
        }
        // Resource order does not change the merge; sort for stable logs.
        let mut names: Vec<&String> = hints.keys().collect();
        names.sort();
        for name in names {
            let list = &hints[name];
            if list.is_empty() {
                out.push(vec![TopologyHint { affinity: None, preferred: false }]);
            } else {
                out.push(list.clone());
            }
        }
    }
    out
}

fn merge_permutation(default: NumaMask, perm: &[TopologyHint]) -> TopologyHint {
    let mut preferred = true;
    let mut mask = default;
    let mut first: Option<NumaMask> = None;
    for h in perm {
        if let Some(a) = h.affinity {
            mask = mask.and(a);
            match first {
                None => first = Some(a),
                Some(f) if f != a => preferred = false,
                Some(_) => {}
            }
        }
        if !h.preferred {
            preferred = false;
        }
    }
    TopologyHint { affinity: Some(mask), preferred }
}

fn max_of_min_affinity_counts(hints: &[Vec<TopologyHint>]) -> u32 {
    hints.iter().filter_map(|list| list.iter().filter_map(|h| h.affinity).map(NumaMask::count).min()).max().unwrap_or(0)
}

fn iterate_permutations(hints: &[Vec<TopologyHint>], acc: &mut Vec<TopologyHint>, f: &mut dyn FnMut(&[TopologyHint])) {
    if acc.len() == hints.len() {
        f(acc);
        return;
    }
    for h in &hints[acc.len()] {
        acc.push(*h);
        iterate_permutations(hints, acc, f);
        acc.pop();
    }
}

/// Every non-empty combination of `nodes` as a mask, in upstream's order
/// (`bitmask.IterateBitMasks`: by size, then lexicographically).
#[must_use]
pub fn iterate_masks(nodes: &[usize]) -> Vec<NumaMask> {
    fn go(nodes: &[usize], start: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<NumaMask>) {
        if cur.len() == k {
            out.push(NumaMask::from_nodes(cur.iter().copied()));
            return;
        }
        for i in start..nodes.len() {
            cur.push(nodes[i]);
            go(nodes, i + 1, k, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    for k in 1..=nodes.len() {
        go(nodes, 0, k, &mut Vec::new(), &mut out);
    }
    out
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
