use std::sync::Mutex;

use super::*;
use crate::lifecycle::admission::PodAdmitHandler;

fn mask(nodes: &[usize]) -> NumaMask {
    NumaMask::from_nodes(nodes.iter().copied())
}

fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint { affinity: Some(mask(nodes)), preferred }
}

fn hints(resource: &str, list: Vec<TopologyHint>) -> Hints {
    Hints::from([(resource.to_owned(), list)])
}

fn manager(policy: &str, scope: &str, topo: &MachineTopology) -> TopologyManager {
    let cfg = TopologyManagerConfig { policy: policy.into(), scope: scope.into(), ..TopologyManagerConfig::default() };
    TopologyManager::new(&cfg, topo, None).unwrap()
}

fn two_nodes() -> MachineTopology {
    MachineTopology::synthetic(2, 1, 2, 1, 1 << 30)
}

#[test]
fn construction_errors_are_upstreams() {
    let t = two_nodes();
    let new = |policy: &str, scope: &str, opts: &[(&str, &str)]| {
        let cfg = TopologyManagerConfig {
            policy: policy.into(),
            scope: scope.into(),
            options: opts.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            feature_gates: BTreeMap::new(),
        };
        TopologyManager::new(&cfg, &t, None).map(|m| m.options)
    };
    assert_eq!(new("bogus", "container", &[]).unwrap_err(), "unknown policy: \"bogus\"");
    assert_eq!(new("restricted", "node", &[]).unwrap_err(), "unknown scope: \"node\"");
    assert_eq!(new("restricted", "pod", &[("x", "1")]).unwrap_err(), "unknown Topology Manager Policy option: \"x\"");
    assert!(new("restricted", "pod", &[("prefer-closest-numa-nodes", "maybe")]).unwrap_err().starts_with("bad value"));
    assert!(
        new("restricted", "pod", &[("max-allowable-numa-nodes", "4")])
            .unwrap_err()
            .contains("should not be less than 8")
    );
    let o =
        new("restricted", "pod", &[("prefer-closest-numa-nodes", "true"), ("max-allowable-numa-nodes", "16")]).unwrap();
    assert!(o.prefer_closest_numa);
    assert_eq!(o.max_allowable_numa_nodes, 16);
    let nine = MachineTopology::synthetic(9, 1, 1, 1, 1 << 30);
    let cfg = TopologyManagerConfig { policy: "best-effort".into(), ..TopologyManagerConfig::default() };
    assert_eq!(
        TopologyManager::new(&cfg, &nine, None).unwrap_err(),
        "unsupported on machines with more than 8 NUMA Nodes"
    );
    let policy_none = TopologyManagerConfig { policy: "none".into(), ..TopologyManagerConfig::default() };
    assert!(TopologyManager::new(&policy_none, &nine, None).is_ok(), "the none policy does not care");
}

#[test]
fn masks_iterate_in_upstream_order() {
    assert_eq!(
        iterate_masks(&[0, 1, 2]),
        vec![mask(&[0]), mask(&[1]), mask(&[2]), mask(&[0, 1]), mask(&[0, 2]), mask(&[1, 2]), mask(&[0, 1, 2])]
    );
}

#[test]
fn merging_follows_each_policy() {
    let t = two_nodes();
    let cpu_both = hints("cpu", vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]);
    let mem_one = hints("memory", vec![h(&[1], true), h(&[0, 1], false)]);
    let none_pref = Hints::new();
    for policy in ["best-effort", "restricted", "single-numa-node"] {
        let m = manager(policy, "container", &t);
        // Aligned on node 1, preferred, everywhere.
        assert_eq!(m.merge(&[cpu_both.clone(), mem_one.clone(), none_pref.clone()]), (h(&[1], true), true), "{policy}");
    }
    // Nothing fits one node: only the wide, non-preferred merge remains.
    let cpu_wide = hints("cpu", vec![h(&[0, 1], true)]);
    let mem_wide = hints("memory", vec![h(&[0, 1], false)]);
    assert_eq!(
        manager("best-effort", "container", &t).merge(&[cpu_wide.clone(), mem_wide.clone()]),
        (h(&[0, 1], false), true)
    );
    assert_eq!(
        manager("restricted", "container", &t).merge(&[cpu_wide.clone(), mem_wide.clone()]),
        (h(&[0, 1], false), false)
    );
    // single-numa-node: a preferred two-node hint is not admitted either, and the
    // any-node result is reported without affinity.
    let (best, admit) = manager("single-numa-node", "container", &t).merge(std::slice::from_ref(&cpu_wide));
    assert!(!admit);
    assert_eq!(best, TopologyHint { affinity: None, preferred: false });
    // A resource that cannot be aligned at all (empty list) fails restricted.
    let cannot = hints("cpu", vec![]);
    assert!(!manager("restricted", "container", &t).merge(std::slice::from_ref(&cannot)).1);
    assert!(manager("best-effort", "container", &t).merge(&[cannot]).1);
    // Different affinities in one permutation are never preferred.
    let a = hints("cpu", vec![h(&[0], true)]);
    let b = hints("memory", vec![h(&[0, 1], true)]);
    assert_eq!(manager("restricted", "container", &t).merge(&[a, b]), (h(&[0], false), false));
    // No provider has a preference: any node, preferred.
    let (best, admit) = manager("single-numa-node", "container", &t).merge(&[Hints::new()]);
    assert!(admit);
    assert_eq!(best.affinity, None);
}

#[test]
fn prefer_closest_numa_nodes_uses_distances() {
    // Four nodes; 0-2 are close (11), everything else far (30).
    let mut t = MachineTopology::synthetic(4, 1, 1, 1, 1 << 30);
    for a in 0..4usize {
        t.distances.insert(
            a,
            (0..4usize)
                .map(|b| {
                    if a == b {
                        10
                    } else if (a == 0 && b == 2) || (a == 2 && b == 0) {
                        11
                    } else {
                        30
                    }
                })
                .collect(),
        );
    }
    let cfg = |closest: bool| TopologyManagerConfig {
        policy: "best-effort".into(),
        scope: "container".into(),
        options: if closest {
            BTreeMap::from([("prefer-closest-numa-nodes".to_owned(), "true".to_owned())])
        } else {
            BTreeMap::new()
        },
        feature_gates: BTreeMap::new(),
    };
    let two = hints("cpu", vec![h(&[0, 1], true), h(&[0, 2], true)]);
    let plain = TopologyManager::new(&cfg(false), &t, None).unwrap();
    assert_eq!(plain.merge(std::slice::from_ref(&two)).0, h(&[0, 1], true), "narrowest then lowest");
    let closest = TopologyManager::new(&cfg(true), &t, None).unwrap();
    assert_eq!(closest.merge(&[two]).0, h(&[0, 2], true), "shortest average distance");
}

/// A provider with fixed hints that records allocations.
#[derive(Debug, Default)]
struct Fake {
    container_hints: Hints,
    pod_hints: Hints,
    refuse: Option<Rejection>,
    allocated: Mutex<Vec<(String, TopologyHint)>>,
    /// The active pod UIDs of each `remove_stale` call.
    stale_calls: Mutex<Vec<Vec<String>>>,
}

impl HintProvider for Fake {
    fn get_topology_hints(&self, _: &Pod, _: &Container) -> Hints {
        self.container_hints.clone()
    }
    fn get_pod_topology_hints(&self, _: &Pod) -> Hints {
        self.pod_hints.clone()
    }
    fn allocate(&self, _: &Pod, c: &Container, affinity: &TopologyHint) -> Result<(), Rejection> {
        if let Some(r) = &self.refuse {
            return Err(r.clone());
        }
        self.allocated.lock().unwrap().push((c.name.clone(), *affinity));
        Ok(())
    }
    fn remove_stale(&self, active: &[Pod]) {
        let uids = active.iter().map(|p| p.metadata.uid.clone().unwrap_or_default()).collect();
        self.stale_calls.lock().unwrap().push(uids);
    }
}

fn pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {"initContainers": [{"name": "init", "image": "x"}], "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}
    }))
    .unwrap()
}

#[test]
fn admission_rejects_with_topology_affinity_error_and_counts_it() {
    let t = two_nodes();
    let mut reg = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(ResourceManagerMetrics::new(&mut reg));
    let cfg =
        TopologyManagerConfig { policy: "single-numa-node".into(), scope: "container".into(), ..Default::default() };
    let mut m = TopologyManager::new(&cfg, &t, Some(metrics.clone())).unwrap();
    let fake = Arc::new(Fake { container_hints: hints("cpu", vec![h(&[0, 1], true)]), ..Fake::default() });
    m.add_hint_provider(fake.clone());
    let r = m.admit(&pod(), &[]).unwrap_err();
    assert_eq!(r.reason, "TopologyAffinityError");
    assert_eq!(r.message, "Resources cannot be allocated with Topology locality");
    assert!(fake.allocated.lock().unwrap().is_empty(), "nothing is allocated for a rejected pod");
    assert_eq!(*fake.stale_calls.lock().unwrap(), vec![vec!["u1".to_owned()]], "the admitted pod counts as active");
    assert_eq!(metrics.topology_manager_admission_requests.get(), 1);
    assert_eq!(metrics.topology_manager_admission_errors.get(), 1);
}

#[test]
fn nothing_is_stale_until_the_pod_sources_are_ready() {
    let mut m = manager("best-effort", "container", &two_nodes());
    let fake = Arc::new(Fake::default());
    m.add_hint_provider(fake.clone());
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ready.clone();
    m.set_sources_ready(Box::new(move || flag.load(std::sync::atomic::Ordering::Relaxed)));
    m.admit(&pod(), &[]).unwrap();
    assert!(fake.stale_calls.lock().unwrap().is_empty());
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    m.admit(&pod(), &[]).unwrap();
    assert_eq!(fake.stale_calls.lock().unwrap().len(), 1);
}

#[test]
fn container_scope_aligns_each_container_and_pod_scope_the_whole_pod() {
    let t = two_nodes();
    let mut m = manager("restricted", "container", &t);
    let fake = Arc::new(Fake { container_hints: hints("cpu", vec![h(&[1], true)]), ..Fake::default() });
    m.add_hint_provider(fake.clone());
    m.admit(&pod(), &[]).unwrap();
    let got = fake.allocated.lock().unwrap().clone();
    assert_eq!(got.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["init", "a", "b"], "init containers first");
    assert!(got.iter().all(|(_, hint)| *hint == h(&[1], true)));
    assert_eq!(m.affinity("u1", "a"), h(&[1], true));

    let mut m = manager("restricted", "pod", &t);
    let fake = Arc::new(Fake {
        container_hints: hints("cpu", vec![]), // would be refused if asked per container
        pod_hints: hints("cpu", vec![h(&[0], true)]),
        ..Fake::default()
    });
    m.add_hint_provider(fake.clone());
    m.admit(&pod(), &[]).unwrap();
    assert!(fake.allocated.lock().unwrap().iter().all(|(_, hint)| *hint == h(&[0], true)));
}

#[test]
fn the_none_policy_allocates_without_hints_and_provider_refusals_reject() {
    let t = two_nodes();
    let mut m = manager("none", "container", &t);
    let fake = Arc::new(Fake { container_hints: hints("cpu", vec![]), ..Fake::default() });
    m.add_hint_provider(fake.clone());
    m.admit(&pod(), &[]).unwrap();
    assert!(fake.allocated.lock().unwrap().iter().all(|(_, hint)| *hint == TopologyHint::default()));
    let mut m = manager("best-effort", "container", &t);
    let refusal = Rejection { reason: "SMTAlignmentError".into(), message: "SMT Alignment Error: x".into() };
    m.add_hint_provider(Arc::new(Fake { refuse: Some(refusal.clone()), ..Fake::default() }));
    assert_eq!(m.admit(&pod(), &[]).unwrap_err(), refusal);
}
