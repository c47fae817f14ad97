//! The machine's CPU and NUMA topology read from sysfs (upstream: cAdvisor's
//! `MachineInfo.Topology` turned into `cpumanager/topology.CPUTopology`).
//!
//! Sources, below an injectable sysfs root (`/sys` on a real node, a temporary tree in
//! unit tests): `devices/system/cpu/online`, each online CPU's
//! `cpu<N>/topology/{physical_package_id,core_id}`, and each NUMA node's
//! `devices/system/node/node<N>/{cpulist,meminfo,distance}` and the node's huge pages
//! (`hugepages/hugepages-<size>kB/nr_hugepages`). A kernel without NUMA nodes in
//! sysfs is one node 0 holding every CPU and `/proc/meminfo`'s memory, as cAdvisor does.
//!
//! A physical core is identified, as upstream, by the lowest CPU id among its threads:
//! sysfs `core_id`s repeat across sockets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::types::cpuset::CpuSet;

/// Where one logical CPU sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    /// NUMA node id.
    pub numa_node: usize,
    /// Socket (physical package) id.
    pub socket: usize,
    /// Core id: the lowest CPU id among the core's threads.
    pub core: usize,
}

/// The machine's CPUs and NUMA nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineTopology {
    /// Every online CPU by id.
    pub cpus: BTreeMap<usize, CpuInfo>,
    /// Memory of each NUMA node, bytes (`MemTotal` of the node's `meminfo`).
    pub numa_memory: BTreeMap<usize, u64>,
    /// NUMA distances: `distances[a][i]` is the distance from node `a` to the `i`-th node
    /// (ascending ids), as the node's `distance` file lists them.
    pub distances: BTreeMap<usize, Vec<u64>>,
    /// Huge pages of each NUMA node: resource name (`hugepages-2Mi`) → bytes.
    pub numa_hugepages: BTreeMap<usize, BTreeMap<String, u64>>,
}

/// The resource name of a huge page size given in KiB (`2048` → `hugepages-2Mi`).
#[must_use]
pub fn hugepage_resource(kib: u64) -> String {
    let size = if kib.is_multiple_of(1 << 20) {
        format!("{}Gi", kib >> 20)
    } else if kib.is_multiple_of(1 << 10) {
        format!("{}Mi", kib >> 10)
    } else {
        format!("{kib}Ki")
    };
    format!("hugepages-{size}")
}

/// Reading the topology failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sysfs file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file does not hold what it should.
    #[error("parsing {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_owned(), source })
}

fn read_cpuset(path: &Path) -> Result<CpuSet, Error> {
    CpuSet::parse(&read(path)?).map_err(|e| Error::Parse { path: path.to_owned(), reason: e.to_string() })
}

fn read_num(path: &Path) -> Result<usize, Error> {
    let text = read(path)?;
    text.trim()
        .parse()
        .map_err(|_| Error::Parse { path: path.to_owned(), reason: format!("{:?} is not a number", text.trim()) })
}

/// `MemTotal` in bytes from a `meminfo` text (`Node 0 MemTotal: 123 kB` or `MemTotal: 123 kB`).
fn mem_total(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once("MemTotal:")?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

impl MachineTopology {
    /// Reads the topology below `sysfs` (normally `/sys`); `proc_meminfo` is used for the
    /// single node of a kernel without NUMA in sysfs.
    ///
    /// # Errors
    /// [`Error`] naming the file that is missing or malformed.
    pub fn detect(sysfs: &Path, proc_meminfo: &Path) -> Result<Self, Error> {
        let cpu_dir = sysfs.join("devices/system/cpu");
        let online = read_cpuset(&cpu_dir.join("online"))?;
        let node_dir = sysfs.join("devices/system/node");
        let mut node_of_cpu = BTreeMap::new();
        let mut numa_memory = BTreeMap::new();
        let mut distances = BTreeMap::new();
        let mut numa_hugepages = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&node_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<usize>().ok()) else { continue };
                let dir = entry.path();
                for cpu in read_cpuset(&dir.join("cpulist"))?.iter() {
                    node_of_cpu.insert(cpu, id);
                }
                let meminfo = dir.join("meminfo");
                let total = mem_total(&read(&meminfo)?)
                    .ok_or_else(|| Error::Parse { path: meminfo.clone(), reason: "no MemTotal line".into() })?;
                numa_memory.insert(id, total);
                if let Ok(text) = std::fs::read_to_string(dir.join("distance")) {
                    distances.insert(id, text.split_whitespace().filter_map(|d| d.parse().ok()).collect());
                }
                let mut pages = BTreeMap::new();
                for e in std::fs::read_dir(dir.join("hugepages")).into_iter().flatten().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let Some(kib) = name.strip_prefix("hugepages-").and_then(|n| n.strip_suffix("kB")) else {
                        continue;
                    };
                    let Ok(kib) = kib.parse::<u64>() else { continue };
                    let count = read_num(&e.path().join("nr_hugepages"))? as u64;
                    pages.insert(hugepage_resource(kib), count * kib * 1024);
                }
                numa_hugepages.insert(id, pages);
            }
        }
        if numa_memory.is_empty() {
            let total = mem_total(&read(proc_meminfo)?)
                .ok_or_else(|| Error::Parse { path: proc_meminfo.to_owned(), reason: "no MemTotal line".into() })?;
            numa_memory.insert(0, total);
        }
        // Threads of a core share (package, core_id); the core is named by its lowest CPU.
        let mut raw = BTreeMap::new();
        for cpu in online.iter() {
            let topo = cpu_dir.join(format!("cpu{cpu}/topology"));
            let socket = read_num(&topo.join("physical_package_id"))?;
            let core_id = read_num(&topo.join("core_id"))?;
            raw.insert(cpu, (socket, core_id));
        }
        let mut core_name: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        for (&cpu, &key) in &raw {
            core_name.entry(key).or_insert(cpu);
        }
        let cpus = raw
            .into_iter()
            .map(|(cpu, key)| {
                let info = CpuInfo {
                    numa_node: node_of_cpu.get(&cpu).copied().unwrap_or(0),
                    socket: key.0,
                    core: core_name[&key],
                };
                (cpu, info)
            })
            .collect();
        Ok(Self { cpus, numa_memory, distances, numa_hugepages })
    }

    /// A synthetic machine: `sockets` × `numa_per_socket` NUMA nodes × `cores_per_numa`
    /// cores × `threads` threads, CPU ids numbered as Linux does on x86 (thread siblings
    /// `n` and `n + cores`), each node with `mem_per_node` bytes. For tests.
    #[must_use]
    pub fn synthetic(
        sockets: usize,
        numa_per_socket: usize,
        cores_per_numa: usize,
        threads: usize,
        mem_per_node: u64,
    ) -> Self {
        let cores = sockets * numa_per_socket * cores_per_numa;
        let mut cpus = BTreeMap::new();
        for t in 0..threads {
            for c in 0..cores {
                let numa = c / cores_per_numa;
                cpus.insert(t * cores + c, CpuInfo { numa_node: numa, socket: numa / numa_per_socket, core: c });
            }
        }
        let nodes = sockets * numa_per_socket;
        let numa_memory = (0..nodes).map(|n| (n, mem_per_node)).collect();
        let distances = (0..nodes).map(|a| (a, (0..nodes).map(|b| if a == b { 10 } else { 20 }).collect())).collect();
        Self { cpus, numa_memory, distances, numa_hugepages: BTreeMap::new() }
    }

    /// The memory types of a NUMA node: `memory`, then its huge page sizes.
    #[must_use]
    pub fn memory_types(&self, node: usize) -> Vec<String> {
        std::iter::once("memory".to_owned())
            .chain(self.numa_hugepages.get(&node).into_iter().flat_map(|m| m.keys().cloned()))
            .collect()
    }

    /// Bytes of a memory type (`memory`, `hugepages-2Mi`) on a NUMA node (0 if none).
    #[must_use]
    pub fn memory_of(&self, node: usize, kind: &str) -> u64 {
        if kind == "memory" {
            return self.numa_memory.get(&node).copied().unwrap_or(0);
        }
        self.numa_hugepages.get(&node).and_then(|m| m.get(kind)).copied().unwrap_or(0)
    }

    /// Every CPU.
    #[must_use]
    pub fn all_cpus(&self) -> CpuSet {
        self.cpus.keys().copied().collect()
    }

    /// The NUMA node ids, ascending (nodes with CPUs or memory).
    #[must_use]
    pub fn numa_nodes(&self) -> Vec<usize> {
        let set: BTreeSet<usize> =
            self.cpus.values().map(|i| i.numa_node).chain(self.numa_memory.keys().copied()).collect();
        set.into_iter().collect()
    }

    /// The socket ids, ascending.
    #[must_use]
    pub fn sockets(&self) -> Vec<usize> {
        let set: BTreeSet<usize> = self.cpus.values().map(|i| i.socket).collect();
        set.into_iter().collect()
    }

    /// Number of physical cores.
    #[must_use]
    pub fn num_cores(&self) -> usize {
        self.cpus.values().map(|i| i.core).collect::<BTreeSet<_>>().len()
    }

    /// Threads per core (upstream `CPUsPerCore`: CPUs / cores; 0 on an empty machine).
    #[must_use]
    pub fn cpus_per_core(&self) -> usize {
        self.cpus.len().checked_div(self.num_cores()).unwrap_or(0)
    }

    /// The CPUs of the given NUMA nodes.
    #[must_use]
    pub fn cpus_in_numa_nodes(&self, nodes: &[usize]) -> CpuSet {
        self.cpus.iter().filter(|(_, i)| nodes.contains(&i.numa_node)).map(|(c, _)| *c).collect()
    }

    /// The CPUs of the given sockets.
    #[must_use]
    pub fn cpus_in_sockets(&self, sockets: &[usize]) -> CpuSet {
        self.cpus.iter().filter(|(_, i)| sockets.contains(&i.socket)).map(|(c, _)| *c).collect()
    }

    /// The CPUs of one core.
    #[must_use]
    pub fn cpus_in_core(&self, core: usize) -> CpuSet {
        self.cpus.iter().filter(|(_, i)| i.core == core).map(|(c, _)| *c).collect()
    }

    /// The distance between two NUMA nodes (10 for a node to itself, 20 when unknown).
    #[must_use]
    pub fn distance(&self, a: usize, b: usize) -> u64 {
        let nodes = self.numa_nodes();
        let idx = nodes.iter().position(|n| *n == b);
        self.distances.get(&a).and_then(|d| idx.and_then(|i| d.get(i))).copied().unwrap_or(if a == b { 10 } else { 20 })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a fake sysfs for `topo` below `root`.
    pub(crate) fn write_sysfs(root: &Path, topo: &MachineTopology) {
        let cpu_dir = root.join("devices/system/cpu");
        std::fs::create_dir_all(&cpu_dir).unwrap();
        std::fs::write(cpu_dir.join("online"), format!("{}\n", topo.all_cpus())).unwrap();
        // sysfs core_id restarts on each socket: write the position within the socket.
        for (cpu, info) in &topo.cpus {
            let dir = cpu_dir.join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("physical_package_id"), format!("{}\n", info.socket)).unwrap();
            let first_core_of_socket =
                topo.cpus.values().filter(|i| i.socket == info.socket).map(|i| i.core).min().unwrap();
            std::fs::write(dir.join("core_id"), format!("{}\n", info.core - first_core_of_socket)).unwrap();
        }
        for node in topo.numa_nodes() {
            let dir = root.join(format!("devices/system/node/node{node}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), format!("{}\n", topo.cpus_in_numa_nodes(&[node]))).unwrap();
            let kb = topo.numa_memory[&node] / 1024;
            std::fs::write(
                dir.join("meminfo"),
                format!("Node {node} MemTotal:       {kb} kB\nNode {node} MemFree: 1 kB\n"),
            )
            .unwrap();
            let d: Vec<String> = topo.numa_nodes().iter().map(|b| topo.distance(node, *b).to_string()).collect();
            std::fs::write(dir.join("distance"), d.join(" ") + "\n").unwrap();
            for (name, bytes) in topo.numa_hugepages.get(&node).into_iter().flatten() {
                let kib = match name.trim_start_matches("hugepages-") {
                    "2Mi" => 2048,
                    "1Gi" => 1 << 20,
                    other => panic!("test sizes only: {other}"),
                };
                let d = dir.join(format!("hugepages/hugepages-{kib}kB"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("nr_hugepages"), format!("{}\n", bytes / (kib * 1024))).unwrap();
            }
        }
    }

    #[test]
    fn reads_a_two_socket_two_numa_smt_machine() {
        let mut want = MachineTopology::synthetic(2, 1, 4, 2, 8 << 30);
        for n in 0..2 {
            want.numa_hugepages
                .insert(n, BTreeMap::from([("hugepages-2Mi".to_owned(), 64 << 20), ("hugepages-1Gi".to_owned(), 0)]));
        }
        let dir = tempfile::tempdir().unwrap();
        write_sysfs(dir.path(), &want);
        let got = MachineTopology::detect(dir.path(), Path::new("/nonexistent")).unwrap();
        assert_eq!(got, want);
        assert_eq!(got.cpus.len(), 16);
        assert_eq!(got.num_cores(), 8);
        assert_eq!(got.cpus_per_core(), 2);
        assert_eq!(got.cpus_in_numa_nodes(&[1]).to_string(), "4-7,12-15");
        assert_eq!(got.cpus_in_core(5).to_string(), "5,13");
        assert_eq!(got.distance(0, 1), 20);
        assert_eq!(got.distance(1, 1), 10);
        assert_eq!(got.memory_types(1), ["memory", "hugepages-1Gi", "hugepages-2Mi"]);
        assert_eq!(got.memory_of(1, "hugepages-2Mi"), 64 << 20);
        assert_eq!(got.memory_of(1, "memory"), 8 << 30);
        assert_eq!(hugepage_resource(2048), "hugepages-2Mi");
        assert_eq!(hugepage_resource(1 << 20), "hugepages-1Gi");
        assert_eq!(hugepage_resource(64), "hugepages-64Ki");
    }

    #[test]
    fn a_kernel_without_numa_is_one_node_with_proc_meminfo() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("devices/system/cpu");
        for n in 0..2 {
            std::fs::create_dir_all(cpu.join(format!("cpu{n}/topology"))).unwrap();
            std::fs::write(cpu.join(format!("cpu{n}/topology/physical_package_id")), "0\n").unwrap();
            std::fs::write(cpu.join(format!("cpu{n}/topology/core_id")), format!("{n}\n")).unwrap();
        }
        std::fs::write(cpu.join("online"), "0-1\n").unwrap();
        let meminfo = dir.path().join("meminfo");
        std::fs::write(&meminfo, "MemTotal:       2048 kB\nMemFree: 1 kB\n").unwrap();
        let got = MachineTopology::detect(dir.path(), &meminfo).unwrap();
        assert_eq!(got.numa_nodes(), vec![0]);
        assert_eq!(got.numa_memory[&0], 2 << 20);
        assert_eq!(got.cpus_per_core(), 1);
    }

    #[test]
    fn a_malformed_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "x\n").unwrap();
        let e = MachineTopology::detect(dir.path(), Path::new("/proc/meminfo")).unwrap_err().to_string();
        assert!(e.contains("devices/system/cpu/online") && e.contains("invalid cpuset"), "{e}");
    }
}
