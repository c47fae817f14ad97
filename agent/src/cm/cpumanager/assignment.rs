//! Choosing which CPUs to hand out (upstream `cpu_assignment.go`).
//!
//! [`take_packed`] is upstream's topology-aware best fit: whole NUMA nodes or sockets
//! first (whichever is the larger unit on this machine), then whole cores, then single
//! threads from the cores, sockets and nodes with the fewest free CPUs (fill what is
//! already broken before breaking more). [`take_distributed`] is the
//! `distribute-cpus-across-numa` variant: the request is spread evenly, in groups of
//! `group` CPUs, over the fewest NUMA nodes that can hold it, choosing the nodes whose
//! free CPUs stay the most balanced afterwards; each node's share is then taken packed.
//! Upstream's uncore-cache step (`prefer-align-cpus-by-uncorecache`) is not implemented.

use std::collections::BTreeMap;

use crate::cm::cpuset::CpuSet;
use crate::cm::machine_topology::MachineTopology;

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

/// Takes `n` CPUs out of `available`, spread over NUMA nodes in groups of `group`
/// (see the module docs). Falls back to [`take_packed`] when `n` is not a multiple of
/// `group` or fits in one node.
///
/// # Errors
/// [`Error::NotEnough`] when fewer than `n` are available.
pub fn take_distributed(topo: &MachineTopology, available: &CpuSet, n: usize, group: usize) -> Result<CpuSet, Error> {
    if available.len() < n {
        return Err(Error::NotEnough { requested: n, available: available.len() });
    }
    let group = group.max(1);
    let nodes = topo.numa_nodes();
    let free: Vec<(usize, CpuSet)> =
        nodes.iter().map(|id| (*id, available.intersection(&topo.cpus_in_numa_nodes(&[*id])))).collect();
    if !n.is_multiple_of(group) || free.iter().any(|(_, f)| f.len() >= n) {
        return take_packed(topo, available, n);
    }
    for k in 2..=free.len() {
        let mut best: Option<(f64, Vec<(usize, usize)>)> = None;
        for combo in combinations(free.len(), k) {
            // Even shares in whole groups; the leftover groups go one by one to the nodes
            // with the most free CPUs.
            let groups = n / group;
            let mut shares: Vec<(usize, usize)> = combo.iter().map(|i| (*i, groups / k * group)).collect();
            let mut order: Vec<usize> = (0..k).collect();
            order.sort_by_key(|j| std::cmp::Reverse(free[combo[*j]].1.len()));
            for j in order.iter().take(groups % k) {
                shares[*j].1 += group;
            }
            if shares.iter().any(|(i, s)| free[*i].1.len() < *s) {
                continue;
            }
            // Balance: variance of every node's free CPUs after the allocation.
            let left: Vec<f64> = free
                .iter()
                .enumerate()
                .map(|(i, (_, f))| (f.len() - shares.iter().find(|(j, _)| *j == i).map_or(0, |s| s.1)) as f64)
                .collect();
            let mean = left.iter().sum::<f64>() / left.len() as f64;
            let var = left.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / left.len() as f64;
            if best.as_ref().is_none_or(|(b, _)| var < *b) {
                best = Some((var, shares));
            }
        }
        if let Some((_, shares)) = best {
            let mut result = CpuSet::new();
            for (i, share) in shares {
                result = result.union(&take_packed(topo, &free[i].1, share)?);
            }
            return Ok(result);
        }
    }
    take_packed(topo, available, n)
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
        // Fits in one node: packed.
        assert_eq!(take_distributed(&t, &all, 4, 2).unwrap(), set("0-1,8-9"));
        // 12 CPUs: 6 per node, in whole cores.
        let got = take_distributed(&t, &all, 12, 2).unwrap();
        assert_eq!(got.intersection(&t.cpus_in_numa_nodes(&[0])).len(), 6);
        assert_eq!(got.intersection(&t.cpus_in_numa_nodes(&[1])).len(), 6);
    }
}
