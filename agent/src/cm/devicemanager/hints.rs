//! Topology hints for device plugin resources (upstream `devicemanager/topology_hints.go`):
//! every combination of the machine's NUMA nodes that can hold the request, preferred
//! when it is as narrow as the narrowest combination that could hold it at all.

use std::collections::BTreeSet;

use crate::cm::topology::{NumaMask, TopologyHint, iterate_masks};

use super::state::State;

fn in_mask(mask: NumaMask, nodes: &[i64]) -> bool {
    nodes.iter().any(|n| usize::try_from(*n).is_ok_and(|n| mask.contains(n)))
}

/// Upstream `generateDeviceTopologyHints`: the masks on which `available` (plus the
/// `reusable` devices, which must all lie in the mask) can satisfy `request`.
#[must_use]
pub fn device_hints(
    state: &State,
    numa_nodes: &[usize],
    resource: &str,
    available: &BTreeSet<String>,
    reusable: &BTreeSet<String>,
    request: usize,
) -> Vec<TopologyHint> {
    let mut min_affinity = numa_nodes.len() as u32;
    let mut hints = Vec::new();
    let all: Vec<&String> = state.all_devices.get(resource).map(|d| d.keys().collect()).unwrap_or_default();
    'masks: for mask in iterate_masks(numa_nodes) {
        let in_this = all.iter().filter(|d| in_mask(mask, &state.numa_of(resource, d))).count();
        if in_this >= request && mask.count() < min_affinity {
            min_affinity = mask.count();
        }
        let mut matching = 0;
        for d in reusable {
            let nodes = state.numa_of(resource, d);
            if nodes.is_empty() {
                continue;
            }
            if !in_mask(mask, &nodes) {
                continue 'masks;
            }
            matching += 1;
        }
        matching += available.iter().filter(|d| in_mask(mask, &state.numa_of(resource, d))).count();
        if matching < request {
            continue;
        }
        hints.push(TopologyHint { affinity: Some(mask), preferred: false });
    }
    for h in &mut hints {
        h.preferred = h.affinity.is_some_and(|m| m.count() == min_affinity);
    }
    hints
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::devicemanager::proto;

    fn dev(id: &str, numa: Option<i64>) -> proto::Device {
        proto::Device {
            id: id.into(),
            health: "Healthy".into(),
            topology: numa.map(|n| proto::TopologyInfo { nodes: vec![proto::NumaNode { id: n }] }),
        }
    }

    #[test]
    fn combinations_go_narrow_first() {
        let m: Vec<u64> = iterate_masks(&[0, 1, 2]).iter().map(|m| m.0).collect();
        assert_eq!(m, vec![0b001, 0b010, 0b100, 0b011, 0b101, 0b110, 0b111]);
    }

    #[test]
    fn hints_prefer_the_narrowest_fitting_masks() {
        let mut s = State::default();
        s.update_devices("r", vec![dev("a", Some(0)), dev("b", Some(0)), dev("c", Some(1))]);
        let available: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let h = device_hints(&s, &[0, 1], "r", &available, &BTreeSet::new(), 2);
        assert_eq!(
            h,
            vec![
                TopologyHint { affinity: Some(NumaMask(0b01)), preferred: true },
                TopologyHint { affinity: Some(NumaMask(0b11)), preferred: false },
            ]
        );
        // With "a" taken only both nodes together hold two devices.
        let available: BTreeSet<String> = ["b", "c"].map(String::from).into();
        let h = device_hints(&s, &[0, 1], "r", &available, &BTreeSet::new(), 2);
        assert_eq!(h, vec![TopologyHint { affinity: Some(NumaMask(0b11)), preferred: false }]);
        // A reusable device on node 1 rules out node 0 alone.
        let reusable: BTreeSet<String> = ["c".to_string()].into();
        let available: BTreeSet<String> = ["a".to_string()].into();
        let h = device_hints(&s, &[0, 1], "r", &available, &reusable, 2);
        assert_eq!(h, vec![TopologyHint { affinity: Some(NumaMask(0b11)), preferred: false }]);
    }
}
