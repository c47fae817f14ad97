//! Choosing which CPUs to hand out (upstream `cpu_assignment.go`).
//!
//! [`take_packed`] is upstream's topology-aware best fit: whole NUMA nodes or sockets
//! first (whichever is the larger unit on this machine), then whole cores, then single
//! threads from the cores, sockets and nodes with the fewest free CPUs (fill what is
//! already broken before breaking more). [`take_distributed`] is the
//! `distribute-cpus-across-numa` variant: the request is spread evenly, in groups of
//! `group` CPUs, over the fewest NUMA nodes that can hold it, choosing the nodes whose
//! free CPUs stay the most balanced afterwards (upstream's "balance score"); each node's
//! share is then taken packed.
//! Upstream's uncore-cache step (`prefer-align-cpus-by-uncorecache`) is not implemented.

use std::collections::BTreeMap;

use crate::cm::machine_topology::MachineTopology;
use crate::types::cpuset::CpuSet;

/// Taking CPUs failed (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Fewer CPUs are free than asked.
    #[error("not enough cpus available to satisfy request: requested={requested}, available={available}")]
    NotEnough {
        /// CPUs asked.
        requested: usize,
        /// CPUs free.
        available: usize,
    },
}

struct Acc<'a> {
    topo: &'a MachineTopology,
    free: CpuSet,
    result: CpuSet,
    need: usize,
    numa_first: bool,
}

impl<'a> Acc<'a> {
    fn new(topo: &'a MachineTopology, free: &CpuSet, need: usize) -> Self {
        // NUMA nodes first when a node holds whole sockets (or is one), else sockets first.
        let numa_first = topo.sockets().len() >= topo.numa_nodes().len();
        Self { topo, free: free.clone(), result: CpuSet::new(), need, numa_first }
    }

    fn take(&mut self, cpus: &CpuSet) {
        self.result = self.result.union(cpus);
        self.free = self.free.difference(cpus);
        self.need -= cpus.len();
    }

    fn free_in(&self, cpus: &CpuSet) -> usize {
        self.free.intersection(cpus).len()
    }

    /// Units (NUMA nodes or sockets) as id → CPUs.
    fn units(&self, numa: bool) -> BTreeMap<usize, CpuSet> {
        let ids = if numa { self.topo.numa_nodes() } else { self.topo.sockets() };
        ids.into_iter()
            .map(|id| {
                let cpus = if numa { self.topo.cpus_in_numa_nodes(&[id]) } else { self.topo.cpus_in_sockets(&[id]) };
                (id, cpus)
            })
            .filter(|(_, c)| !c.is_empty())
            .collect()
    }

    /// Takes every wholly free unit whose size still fits the request.
    fn take_full_units(&mut self, numa: bool) {
        for cpus in self.units(numa).into_values() {
            if self.need == 0 {
                return;
            }
            if self.free_in(&cpus) == cpus.len() && cpus.len() <= self.need {
                self.take(&cpus);
            }
        }
    }

    /// Rank of a CPU's first- and second-level units: fewest free CPUs first, then id.
    fn sorted_cores(&self) -> Vec<(usize, CpuSet)> {
        let (first, second) = (self.units(self.numa_first), self.units(!self.numa_first));
        let rank = |units: &BTreeMap<usize, CpuSet>, cpu: usize| {
            units
                .iter()
                .find(|(_, c)| c.contains(cpu))
                .map_or((usize::MAX, usize::MAX), |(id, c)| (self.free_in(c), *id))
        };
        let mut cores: BTreeMap<usize, CpuSet> = BTreeMap::new();
        for cpu in self.free.iter() {
            let core = self.topo.cpus[&cpu].core;
            cores.entry(core).or_insert_with(|| self.topo.cpus_in_core(core));
        }
        let mut v: Vec<_> = cores.into_iter().collect();
        v.sort_by_key(|(id, cpus)| {
            let first_cpu = cpus.iter().next().unwrap_or(0);
            (rank(&first, first_cpu), rank(&second, first_cpu), self.free_in(cpus), *id)
        });
        v
    }

    fn take_full_cores(&mut self) {
        for (_, cpus) in self.sorted_cores() {
            if self.need == 0 {
                return;
            }
            if self.free_in(&cpus) == cpus.len() && cpus.len() <= self.need {
                self.take(&cpus);
            }
        }
    }

    fn take_remaining(&mut self) {
        for (_, cpus) in self.sorted_cores() {
            for cpu in self.free.intersection(&cpus).iter() {
                if self.need == 0 {
                    return;
                }
                self.take(&std::iter::once(cpu).collect());
            }
        }
    }
}

/// Takes `n` CPUs out of `available`, packed (see the module docs).
///
/// # Errors
/// [`Error::NotEnough`] when fewer than `n` are available.
pub fn take_packed(topo: &MachineTopology, available: &CpuSet, n: usize) -> Result<CpuSet, Error> {
    if available.len() < n {
        return Err(Error::NotEnough { requested: n, available: available.len() });
    }
    let mut acc = Acc::new(topo, available, n);
    if acc.need > 0 {
        acc.take_full_units(acc.numa_first);
    }
    if acc.need > 0 {
        acc.take_full_units(!acc.numa_first);
    }
    if acc.need > 0 {
        acc.take_full_cores();
    }
    if acc.need > 0 {
        acc.take_remaining();
    }
    Ok(acc.result)
}

/// Takes `n` CPUs out of `available`, spread evenly over NUMA nodes in groups of
/// `group` CPUs (upstream `takeByTopologyNUMADistributed`): for k = the fewest nodes that
/// could hold the request up to the most it could need, every k-combination of nodes
/// that can take an even share is scored by the standard deviation of the free CPUs
/// every node keeps afterwards (trying each subset of the combination for the
/// remainder); the best-balanced one is taken, each node's share packed. Falls back to
/// [`take_packed`] when `n` is not a multiple of `group` or no combination works.
///
/// # Errors
/// [`Error::NotEnough`] when fewer than `n` are available.
pub fn take_distributed(topo: &MachineTopology, available: &CpuSet, n: usize, group: usize) -> Result<CpuSet, Error> {
    let group = group.max(1);
    if !n.is_multiple_of(group) {
        return take_packed(topo, available, n);
    }
    if available.len() < n {
        return Err(Error::NotEnough { requested: n, available: available.len() });
    }
    if n == 0 {
        return Ok(CpuSet::new());
    }
    let free_of = |node: usize| available.intersection(&topo.cpus_in_numa_nodes(&[node]));
    // Nodes with free CPUs, fewest free first (upstream sortAvailableNUMANodes).
    let mut numas: Vec<usize> = topo.numa_nodes().into_iter().filter(|id| !free_of(*id).is_empty()).collect();
    numas.sort_by_key(|id| (free_of(*id).len(), *id));
    let free: BTreeMap<usize, usize> = numas.iter().map(|id| (*id, free_of(*id).len())).collect();
    // Upstream rangeNUMANodesNeededToSatisfy.
    let all_nodes = topo.numa_nodes().len().max(1);
    let groups_total = (topo.cpus.len().max(1) - 1) / group + 1;
    let groups_per_node = (groups_total - 1) / all_nodes + 1;
    let groups_needed = (n - 1) / group + 1;
    let min_k = (groups_needed - 1) / groups_per_node + 1;
    let max_k = groups_needed.min(numas.len());
    for k in min_k..=max_k {
        let mut best: Option<(f64, Vec<usize>, Vec<usize>)> = None;
        for combo in
            combinations(numas.len(), k).into_iter().map(|c| c.into_iter().map(|i| numas[i]).collect::<Vec<_>>())
        {
            if best.as_ref().is_some_and(|(b, _, _)| *b == 0.0) {
                break;
            }
            if combo.iter().map(|id| free[id]).sum::<usize>() < n
                || combo.iter().map(|id| free[id] / group).sum::<usize>() * group < n
            {
                continue;
            }
            let share = n / k / group * group;
            if combo.iter().any(|id| free[id] < share) {
                continue;
            }
            let mut after = free.clone();
            for id in &combo {
                *after.get_mut(id).unwrap() -= share;
            }
            let remainder = n - share * k;
            let mut local: Option<(f64, Vec<usize>)> = None;
            if remainder == 0 {
                local = Some((std_dev(after.values()), Vec::new()));
            }
            let candidates: Vec<usize> = combo.iter().copied().filter(|id| after[id] >= group).collect();
            for r in (1..=candidates.len()).rev() {
                if remainder == 0 {
                    break;
                }
                for subset in combinations(candidates.len(), r) {
                    let subset: Vec<usize> = subset.into_iter().map(|i| candidates[i]).collect();
                    if subset.iter().map(|id| after[id]).sum::<usize>() < remainder {
                        continue;
                    }
                    let mut left = after.clone();
                    let mut rem = remainder;
                    while rem > 0 {
                        let before = rem;
                        for id in &subset {
                            if rem > 0 && left[id] >= group {
                                *left.get_mut(id).unwrap() -= group;
                                rem -= group;
                            }
                        }
                        if rem == before {
                            break;
                        }
                    }
                    if rem > 0 {
                        continue;
                    }
                    let balance = std_dev(left.values());
                    if local.as_ref().is_none_or(|(b, _)| balance < *b) {
                        local = Some((balance, subset));
                    }
                }
            }
            if let Some((balance, subset)) = local
                && best.as_ref().is_none_or(|(b, _, _)| balance < *b)
            {
                best = Some((balance, combo, subset));
            }
        }
        let Some((_, combo, subset)) = best else { continue };
        let share = n / k / group * group;
        let mut result = CpuSet::new();
        let mut left: BTreeMap<usize, CpuSet> = combo.iter().map(|id| (*id, free_of(*id))).collect();
        for id in &combo {
            let taken = take_packed(topo, &left[id], share)?;
            left.insert(*id, left[id].difference(&taken));
            result = result.union(&taken);
        }
        let mut rem = n - share * k;
        while rem > 0 {
            let before = rem;
            for id in &subset {
                if rem > 0 && left[id].len() >= group {
                    let taken = take_packed(topo, &left[id], group)?;
                    left.insert(*id, left[id].difference(&taken));
                    result = result.union(&taken);
                    rem -= group;
                }
            }
            if rem == before {
                break;
            }
        }
        if rem == 0 {
            return Ok(result);
        }
    }
    take_packed(topo, available, n)
}

/// Population standard deviation.
fn std_dev<'a>(values: impl Iterator<Item = &'a usize>) -> f64 {
    let v: Vec<f64> = values.map(|x| *x as f64).collect();
    if v.is_empty() {
        return 0.0;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64).sqrt()
}

fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    fn go(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            go(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    go(0, n, k, &mut Vec::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    /// 2 sockets = 2 NUMA nodes × 4 cores × 2 threads: node 0 = 0-3,8-11; node 1 = 4-7,12-15.
    fn two_numa_smt() -> MachineTopology {
        MachineTopology::synthetic(2, 1, 4, 2, 1 << 30)
    }

    #[test]
    fn packed_takes_whole_cores_then_threads() {
        let t = two_numa_smt();
        let all = t.all_cpus();
        // Reserving 2 CPUs takes one whole core: {0,8} (upstream's example).
        assert_eq!(take_packed(&t, &all, 2).unwrap(), set("0,8"));
        // One thread: the lowest CPU of the fullest socket.
        assert_eq!(take_packed(&t, &all, 1).unwrap(), set("0"));
        // A whole NUMA node when the request is that big.
        assert_eq!(take_packed(&t, &all, 8).unwrap(), set("0-3,8-11"));
        assert_eq!(take_packed(&t, &all, 10).unwrap(), set("0-4,8-12"));
    }

    #[test]
    fn packed_fills_broken_cores_and_busy_sockets_first() {
        let t = two_numa_smt();
        // CPU 0 is taken: its sibling 8 is the best single thread.
        let free = t.all_cpus().difference(&set("0"));
        assert_eq!(take_packed(&t, &free, 1).unwrap(), set("8"));
        // Node 1 is partly used: a core comes from it rather than from the free node 0.
        let free = t.all_cpus().difference(&set("4,12"));
        assert_eq!(take_packed(&t, &free, 2).unwrap(), set("5,13"));
    }

    #[test]
    fn packed_refuses_more_than_available() {
        let t = two_numa_smt();
        assert_eq!(
            take_packed(&t, &set("1-2"), 3).unwrap_err().to_string(),
            "not enough cpus available to satisfy request: requested=3, available=2"
        );
    }

    #[test]
    fn distributed_spreads_over_numa_nodes() {
        let t = two_numa_smt();
        let all = t.all_cpus();
        // Fits in one node: the node that stays the most balanced (here: equal, the first).
        assert_eq!(take_distributed(&t, &all, 4, 2).unwrap(), set("0-1,8-9"));
        // Node 0 is partly used: one node of 4 goes to the freer node 1 (balance).
        let busy = all.difference(&set("0-1,8-9"));
        assert_eq!(take_distributed(&t, &busy, 4, 2).unwrap(), set("4-5,12-13"));
        // 12 CPUs: 6 per node, in whole cores.
        let got = take_distributed(&t, &all, 12, 2).unwrap();
        assert_eq!(got.intersection(&t.cpus_in_numa_nodes(&[0])).len(), 6);
        assert_eq!(got.intersection(&t.cpus_in_numa_nodes(&[1])).len(), 6);
        assert!(
            got.iter().all(|c| got.contains(t.cpus_in_core(t.cpus[&c].core).iter().next().unwrap())),
            "whole cores"
        );
        // Four nodes of 4 CPUs, 6 asked: the fewest nodes that can hold it (2), an even
        // share of 2 each and the remainder group on one of them, as upstream.
        let four_numa = MachineTopology::synthetic(2, 2, 2, 2, 1 << 30);
        let got = take_distributed(&four_numa, &four_numa.all_cpus(), 6, 2).unwrap();
        let per_node: Vec<usize> =
            (0..4).map(|n| got.intersection(&four_numa.cpus_in_numa_nodes(&[n])).len()).collect();
        assert_eq!(per_node, vec![4, 2, 0, 0]);
        // 8 CPUs while node 0 has only 2 free: the balance keeps the fuller nodes apart.
        let busy = four_numa.all_cpus().difference(&four_numa.cpus_in_numa_nodes(&[0])).union(&set("0,8"));
        let got = take_distributed(&four_numa, &busy, 8, 2).unwrap();
        let per_node: Vec<usize> =
            (0..4).map(|n| got.intersection(&four_numa.cpus_in_numa_nodes(&[n])).len()).collect();
        assert_eq!(per_node.iter().sum::<usize>(), 8);
        assert_eq!(per_node[0], 0, "the busy node is left alone: {per_node:?}");
        // Not a multiple of the group: packed.
        assert_eq!(take_distributed(&t, &all, 3, 2).unwrap(), take_packed(&t, &all, 3).unwrap());
    }
}
