//! Cost of one stats collection (`Collector::collect`, what housekeeping and every
//! eviction pass run) at a node's pod count, on the real cgroup filesystem: `--pods` pods
//! (default 500), each a pod cgroup with one container cgroup holding a sleeping process
//! of its own, made under `/sys/fs/cgroup/<hierarchy>/swiftlet-bench-<pid>` and removed
//! again at the end (processes killed by pid first).
//!
//! `cargo bench -p swiftlet --bench stats_collect [-- PODS [ITERATIONS]]` (as root) prints
//! the median and the fastest wall time of the collections (default 20, after one
//! unmeasured warm-up), the CPU time (user + system, `getrusage`) each cost, and what the
//! collector keeps between collections: open descriptors and the kernel's slab memory
//! they hold (the growth of `/proc/meminfo`'s `Slab` over the first collection, a rough
//! figure on a busy host).
//! Then the same for lean collections (the eviction manager's while nobody reads the
//! stats). A plain `main`, not a test: nothing is asserted about time.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use swiftlet::stats::collector::{Collector, CollectorConfig, ContainerInventory, Inventory, PodInventory};
use swiftlet::stats::{CgroupHierarchies, FsUsageConfig};

/// The hierarchy directories to make each cgroup in (co-mounted ones once).
fn hierarchy_dirs(h: &CgroupHierarchies) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = match h {
        CgroupHierarchies::V1 { cpuacct, cpu, memory, pids, blkio, unified } => {
            [Some(cpuacct), cpu.as_ref(), Some(memory), pids.as_ref(), blkio.as_ref(), unified.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|p| std::fs::canonicalize(p).ok())
                .collect()
        }
        CgroupHierarchies::V2 { root } => vec![root.clone()],
    };
    dirs.sort();
    dirs.dedup();
    dirs
}

struct Bed {
    dirs: Vec<PathBuf>,
    base: String,
    /// Relative cgroup paths, parents before children.
    cgroups: Vec<String>,
    sleepers: Vec<Child>,
}

impl Bed {
    fn mkdir(&mut self, cgroup: &str) {
        for d in &self.dirs {
            let path = d.join(cgroup.trim_start_matches('/'));
            std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e} (run as root)", path.display()));
        }
        self.cgroups.push(cgroup.to_owned());
    }

    /// A sleeping process of its own in `cgroup` of every hierarchy.
    fn populate(&mut self, cgroup: &str) {
        let child = Command::new("sleep").arg("3600").spawn().expect("spawning sleep");
        for d in &self.dirs {
            let procs = d.join(cgroup.trim_start_matches('/')).join("cgroup.procs");
            std::fs::write(&procs, child.id().to_string())
                .unwrap_or_else(|e| panic!("moving {} into {}: {e}", child.id(), procs.display()));
        }
        self.sleepers.push(child);
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for c in &mut self.sleepers {
            let _ = c.kill();
            let _ = c.wait();
        }
        for cgroup in self.cgroups.iter().rev() {
            for d in &self.dirs {
                let path = d.join(cgroup.trim_start_matches('/'));
                if let Err(e) = std::fs::remove_dir(&path) {
                    eprintln!("removing {}: {e}", path.display());
                }
            }
        }
    }
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &raw mut u);
        u
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The kernel's slab memory (`Slab` of `/proc/meminfo`), KiB.
fn slab_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("Slab:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let pods: usize = args.next().map_or(500, |a| a.parse().expect("PODS is a number"));
    let iterations: usize = args.next().map_or(20, |a| a.parse().expect("ITERATIONS is a number"));
    let hierarchies = CgroupHierarchies::detect(Path::new("/sys/fs/cgroup")).expect("a cgroup filesystem");
    let base = format!("/swiftlet-bench-{}", std::process::id());
    let mut bed =
        Bed { dirs: hierarchy_dirs(&hierarchies), base: base.clone(), cgroups: Vec::new(), sleepers: Vec::new() };
    bed.mkdir(&base);
    let mut inventory = Inventory {
        node_name: "bench".into(),
        pods_cgroup: Some(base.clone()),
        root_fs_path: PathBuf::from("/var/lib"),
        ..Inventory::default()
    };
    for i in 0..pods {
        let pod = format!("{}/pod{i:04}", bed.base);
        let container = format!("{pod}/c{i:04}");
        bed.mkdir(&pod);
        bed.mkdir(&container);
        bed.populate(&container);
        inventory.pods.push(PodInventory {
            uid: format!("uid-{i:04}"),
            name: format!("p{i:04}"),
            namespace: "bench".into(),
            cgroup: pod,
            containers: vec![ContainerInventory {
                name: "c".into(),
                id: format!("{i:064}"),
                cgroup: container,
                image: "busybox".into(),
                // Known, so that no process's mount table is read for it.
                writable_layer: Some(PathBuf::from("/nonexistent")),
                ..ContainerInventory::default()
            }],
            ..PodInventory::default()
        });
    }
    let mut config = CollectorConfig::new(hierarchies);
    config.fs_usage = FsUsageConfig::default();
    let mut collector = Collector::new(config);
    collector.set_process_walk(true);
    let slab_before = slab_kib();
    std::hint::black_box(collector.collect(&inventory));
    let slab_kept = slab_kib().saturating_sub(slab_before);
    let descriptors = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    let (median, fastest, cpu) = time_collections(&mut collector, &inventory, iterations);
    println!(
        "stats collection, {pods} pods ({} cgroups), {iterations} collections: median {median:.1} ms, fastest {fastest:.1} ms, CPU {cpu:.1} ms each; \
         kept between collections: {descriptors} descriptors, kernel slab +{:.1} MiB",
        1 + 2 * pods,
        slab_kept as f64 / 1024.0,
    );
    // The eviction manager's collections while nobody reads the stats.
    collector.set_process_walk(false);
    collector.set_lean(true);
    let (median, fastest, cpu) = time_collections(&mut collector, &inventory, iterations);
    println!(
        "lean stats collection (eviction, nobody reading): median {median:.1} ms, fastest {fastest:.1} ms, CPU {cpu:.1} ms each"
    );
}

/// The median and fastest wall time and the mean CPU time of `iterations` collections, ms.
fn time_collections(collector: &mut Collector, inventory: &Inventory, iterations: usize) -> (f64, f64, f64) {
    std::hint::black_box(collector.collect(inventory));
    let cpu_before = cpu_time();
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        std::hint::black_box(collector.collect(inventory));
        times.push(start.elapsed());
    }
    let cpu = cpu_time().saturating_sub(cpu_before);
    times.sort();
    let n = u32::try_from(iterations.max(1)).unwrap_or(u32::MAX);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(times[times.len() / 2]), ms(times[0]), ms(cpu / n))
}
