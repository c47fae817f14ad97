//! Tests of the stats module over fixture cgroup and proc trees (v1 and v2) in a
//! temporary directory, the Summary JSON against the kubelet 1.28 sample, and
//! `/metrics/resource` against the 1.28 inventory.

#![allow(clippy::float_cmp, clippy::many_single_char_names, clippy::similar_names)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::collector::Clock;
use super::resource_metrics;
use super::summary::{Summary, Time};
use super::*;
use crate::types::prom_text::write_go_float;

const SUMMARY_SAMPLE: &str = include_str!("../../../tests/fixtures/reference/kubelet-1.28/summary-sample.json");
const RESOURCE_INVENTORY: &str = include_str!("../../../tests/fixtures/reference/kubelet-1.28/metrics-resource.txt");
const CADVISOR_INVENTORY: &str = include_str!("../../../tests/fixtures/reference/kubelet-1.28/metrics-cadvisor.txt");

const POD_UID: &str = "fcda0808-b6d1-42dd-b8ec-a4159717362c";
const POD_CG: &str = "/kubepods/burstable/podfcda0808-b6d1-42dd-b8ec-a4159717362c";
const T0: u64 = 1_796_059_689; // 2026-11-30T17:28:09Z

/// Writes a fixture file under `root` (a leading `/` of `rel` is part of the relative path:
/// fixtures never escape the temporary directory).
fn write(root: &Path, rel: &str, content: &str) {
    let path = root.join(rel.trim_start_matches('/'));
    assert!(path.starts_with(root) && !rel.contains(".."), "{}", path.display());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn at(secs: u64, millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
}

/// A clock the test moves.
fn test_clock(start: SystemTime) -> (Clock, Arc<Mutex<SystemTime>>) {
    let now = Arc::new(Mutex::new(start));
    let handle = Arc::clone(&now);
    (Arc::new(move || *now.lock().unwrap()), handle)
}

const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0:    1296      12    1    0    0     0          0         0      752       8    2    0    0     0       0          0
";

const HOST_NET_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 403308441   93134    0    0    0     0          0         0 403308441   93134    0    0    0     0       0          0
  ifb0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0: 569474224  400000    0    0    0     0          0         0  1685543   20000    0    0    0     0       0          0
veth1234:   5000      50    0    0    0     0          0         0     5000      50    0    0    0     0       0          0
";

const PSI: &str =
    "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=789\n";

/// procfs shared by both fixtures: no swap, 24 GiB, boot at `T0 - 5281`.
fn write_proc(proc_root: &Path) {
    write(
        proc_root,
        "stat",
        "cpu  1000 100 500 90000 50 10 20 30 0 0\ncpu0 1000 100 500 90000 50 10 20 30 0 0\nbtime 1796054408\n",
    );
    write(
        proc_root,
        "meminfo",
        "MemTotal:       25165824 kB\nMemFree:        12000000 kB\nInactive(file):  6000000 kB\nAnonPages:        200000 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n",
    );
    write(proc_root, "loadavg", "4.10 6.41 4.61 1/386 27015\n");
    write(proc_root, "sys/kernel/pid_max", "32768\n");
    write(proc_root, "sys/kernel/threads-max", "192730\n");
    write(proc_root, "1/net/dev", HOST_NET_DEV);
    write(proc_root, "4240/net/dev", NET_DEV);
    write(proc_root, "pressure/cpu", PSI);
    write(proc_root, "pressure/memory", PSI);
    write(proc_root, "pressure/io", PSI);
    // The processes cAdvisor's process stats walk: the root container's root process
    // (pid 1) and app's (4242; 4243 has exited: no directory).
    write(proc_root, "1/limits", &limits("unlimited", "unlimited"));
    fd_links(proc_root, 1, &["/dev/null", "socket:[17]", "anon_inode:[eventpoll]"]);
    write(proc_root, "4242/limits", &limits("1048576", "1048576"));
    fd_links(proc_root, 4242, &["/dev/null", "pipe:[4]", "socket:[18]", "socket:[19]", "/app/data.db"]);
}

/// A `/proc/<pid>/limits` with the given `Max open files`.
fn limits(soft: &str, hard: &str) -> String {
    format!(
        "Limit                     Soft Limit           Hard Limit           Units     \n\
         Max cpu time              unlimited            unlimited            seconds   \n\
         Max open files            {soft:<21}{hard:<21}files     \n\
         Max processes             127563               127563               processes \n"
    )
}

/// A fake `/proc/<pid>/fd` whose descriptors link to `targets` (dangling, as most are).
fn fd_links(proc_root: &Path, pid: u32, targets: &[&str]) {
    let dir = proc_root.join(format!("{pid}/fd"));
    std::fs::create_dir_all(&dir).unwrap();
    for (fd, target) in targets.iter().enumerate() {
        std::os::unix::fs::symlink(target, dir.join(fd.to_string())).unwrap();
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    cg: PathBuf,
    proc_root: PathBuf,
    now: Arc<Mutex<SystemTime>>,
    collector: Collector,
    inventory: Inventory,
}

impl Fixture {
    fn collect(&mut self) -> Collection {
        self.collector.collect(&self.inventory)
    }

    /// Walks what the last pass registered (the background task's work).
    fn refresh_fs(&self) -> usize {
        self.collector.fs_usage().refresh_due()
    }

    fn advance(&self, d: Duration) {
        let mut now = self.now.lock().unwrap();
        *now += d;
    }

    fn set_v1_cpu(&self, cgroup: &str, ns: u64) {
        write(&self.cg, &format!("cpuacct{cgroup}/cpuacct.usage"), &format!("{ns}\n"));
    }
}

fn inventory(root: &Path, with_v1_sandbox: bool) -> Inventory {
    let logs = root.join("var/log/pods/nodebench_web_fcda0808-b6d1-42dd-b8ec-a4159717362c");
    Inventory {
        node_name: "node-a".to_owned(),
        pods_cgroup: Some("/kubepods".to_owned()),
        system_containers: Vec::new(),
        root_fs_path: root.to_path_buf(),
        image_fs: Some(ImageFsInventory {
            mountpoint: root.to_path_buf(),
            used_bytes: Some(2_125_824),
            inodes_used: Some(69),
            time: Some(at(T0 - 1, 0)),
        }),
        pods: vec![
            PodInventory {
                uid: POD_UID.to_owned(),
                name: "web".to_owned(),
                namespace: "nodebench".to_owned(),
                cgroup: POD_CG.to_owned(),
                start_time: Some(at(T0 - 70, 250)),
                sandbox_id: "sandbox1".to_owned(),
                sandbox_cgroup: with_v1_sandbox.then(|| format!("{POD_CG}/sandbox1")),
                log_dir: Some(logs.clone()),
                etc_hosts: Some(root.join("var/lib/kubelet/pods/uid/etc-hosts")),
                volumes: vec![
                    VolumeInventory {
                        name: "scratch".to_owned(),
                        path: root.join("volumes/scratch"),
                        local_ephemeral: true,
                        pvc: None,
                        driver: None,
                    },
                    VolumeInventory {
                        name: "sec".to_owned(),
                        path: root.join("volumes/sec"),
                        local_ephemeral: false,
                        pvc: None,
                        driver: None,
                    },
                    VolumeInventory {
                        name: "missing".to_owned(),
                        path: root.join("volumes/missing"),
                        local_ephemeral: true,
                        pvc: None,
                        driver: None,
                    },
                ],
                containers: vec![
                    ContainerInventory {
                        name: "app".to_owned(),
                        id: "c1".to_owned(),
                        cgroup: format!("{POD_CG}/c1"),
                        start_time: Some(at(T0 - 70, 500)),
                        image: "registry.k8s.io/pause:3.9".to_owned(),
                        log_dir: Some(logs.join("app")),
                        writable_layer: Some(root.join("layers/c1")),
                    },
                    ContainerInventory {
                        name: "sidecar".to_owned(),
                        id: "c2".to_owned(),
                        cgroup: format!("{POD_CG}/c2"),
                        start_time: Some(at(T0 - 60, 0)),
                        image: "busybox".to_owned(),
                        log_dir: Some(logs.join("sidecar")),
                        writable_layer: None,
                    },
                    ContainerInventory {
                        name: "bare".to_owned(),
                        id: "c3".to_owned(),
                        cgroup: format!("{POD_CG}/c3"),
                        start_time: Some(at(T0 - 50, 0)),
                        image: "busybox".to_owned(),
                        log_dir: None,
                        writable_layer: None,
                    },
                    // Exited and removed after the inventory was taken.
                    ContainerInventory {
                        name: "gone".to_owned(),
                        id: "c4".to_owned(),
                        cgroup: format!("{POD_CG}/c4"),
                        start_time: Some(at(T0 - 40, 0)),
                        image: "busybox".to_owned(),
                        log_dir: None,
                        writable_layer: None,
                    },
                ],
            },
            // A pod whose only container vanished: left out.
            PodInventory {
                uid: "u2".to_owned(),
                name: "ghost".to_owned(),
                namespace: "default".to_owned(),
                cgroup: "/kubepods/besteffort/podu2".to_owned(),
                start_time: Some(at(T0 - 10, 0)),
                sandbox_id: "sandbox2".to_owned(),
                containers: vec![ContainerInventory {
                    name: "c".to_owned(),
                    id: "c9".to_owned(),
                    cgroup: "/kubepods/besteffort/podu2/c9".to_owned(),
                    start_time: Some(at(T0 - 10, 0)),
                    ..ContainerInventory::default()
                }],
                ..PodInventory::default()
            },
        ],
    }
}

/// Files that are not cgroup files: logs, writable layer, volumes, etc-hosts.
fn write_node_files(root: &Path) {
    let logs = root.join("var/log/pods/nodebench_web_fcda0808-b6d1-42dd-b8ec-a4159717362c");
    write(&logs, "app/0.log", &"x".repeat(5000));
    write(&logs, "app/0.log.20261130-172800", &"y".repeat(100));
    std::fs::create_dir_all(logs.join("sidecar")).unwrap();
    write(root, "layers/c1/etc/motd", &"m".repeat(10_000));
    write(root, "volumes/scratch/data", &"d".repeat(3000));
    write(root, "volumes/sec/token", "secret");
    write(root, "var/lib/kubelet/pods/uid/etc-hosts", "127.0.0.1 localhost\n");
    // sidecar's writable layer, found from its process's mount table (pid 4250).
    write(root, "layers/c2/tmp/scratch", &"s".repeat(2000));
    let proc_root = root.join("proc");
    write(
        &proc_root,
        "4250/mountinfo",
        &format!(
            "700 600 0:90 / / rw,relatime - overlay overlay rw,lowerdir=/snap/1/fs:/snap/2/fs,upperdir={},workdir={}\n701 700 0:91 / /proc rw - proc proc rw\n",
            root.join("layers/c2").display(),
            root.join("work/c2").display()
        ),
    );
    write_mounts(root);
}

/// The agent's mount table, disk statistics and block devices.
fn write_mounts(root: &Path) {
    for d in ["bind", "shm", "shm2", "ovl", "with space"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let r = root.display();
    write(
        &root.join("proc"),
        "self/mountinfo",
        &format!(
            "1 0 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
2 1 254:0 /data {r}/bind rw,relatime - ext4 /dev/vda rw
3 1 0:23 / {r}/shm rw,nosuid - tmpfs tmpfs rw,size=65536k
4 1 0:24 / {r}/shm2 rw - tmpfs tmpfs rw
5 1 0:50 / {r}/ovl rw - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
6 1 0:22 / /sys rw - sysfs sysfs rw
7 1 8:17 / {r}/gone rw - xfs /dev/sdb1 rw
8 1 8:32 / {r}/with\\040space rw - ext4 /dev/sdc rw
"
        ),
    );
    write(
        &root.join("proc"),
        "diskstats",
        " 254       0 vda 10 1 80 5000 20 2 160 7000 0 9000 12000 0 0 0 0
   8      32 sdc 3 0 24 15 0 0 0 0 1 20 15
   7       0 loop0 9 9 9 9 9 9 9 9 9 9 9
 259       0 nvme0n1 5 5 5 5 5 5 5 5 5 5 5
",
    );
    let sys = root.join("sys/block");
    for (name, dev) in [("vda", "254:0"), ("sdb", "8:16"), ("loop0", "7:0"), ("sr0", "11:0"), ("nvme0c0n1", "259:1")] {
        write(&sys, &format!("{name}/dev"), &format!("{dev}\n"));
    }
    write(&sys, "nvme0c0n1/hidden", "1\n");
}

const V1_UNLIMITED: &str = "9223372036854771712\n";

fn v1_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let cg = root.join("cgroup");
    let proc_root = root.join("proc");
    write_proc(&proc_root);
    write_node_files(&root);
    for h in ["cpu", "pids"] {
        std::fs::create_dir_all(cg.join(h)).unwrap();
    }
    write(&cg, "unified/cgroup.procs", "");
    // Block I/O: nothing at the root (as on the test machines), per device below.
    write(&cg, "blkio/blkio.throttle.io_serviced_recursive", "Total 0\n");
    write(
        &cg,
        &format!("blkio{POD_CG}/blkio.throttle.io_serviced_recursive"),
        "254:0 Read 8\n254:0 Write 3\nTotal 11\n",
    );
    write(&cg, &format!("blkio{POD_CG}/c1/blkio.bfq.io_serviced_recursive"), "Total 0\n");
    write(
        &cg,
        &format!("blkio{POD_CG}/c1/blkio.throttle.io_serviced_recursive"),
        "254:0 Read 7\n254:0 Write 3\n254:0 Sync 10\n254:0 Async 0\n254:0 Discard 0\n254:0 Total 10\n8:16 Read 1\n8:16 Write 0\n8:16 Total 1\n1:5 Read 2\n1:5 Write 0\nTotal 13\n",
    );

    // Root cgroup: cpu spec files and its own processes (cAdvisor walks the cpu ones).
    write(&cg, "cpu/cpu.shares", "1024\n");
    write(&cg, "cpu/cpu.cfs_period_us", "100000\n");
    write(&cg, "cpu/cgroup.procs", "1\n2\n");
    write(&cg, "memory/memory.soft_limit_in_bytes", V1_UNLIMITED);
    write(&cg, "cpuacct/cpuacct.usage", "5028767409292\n");
    write(&cg, "cpuacct/cpuacct.stat", "user 300000\nsystem 100000\n");
    write(&cg, "memory/memory.usage_in_bytes", "1642434560\n");
    write(
        &cg,
        "memory/memory.stat",
        "cache 10543104\nrss 5771264\npgfault 121269\npgmajfault 0\ninactive_file 53248\ntotal_cache 1100000000\ntotal_rss 487071744\ntotal_inactive_file 528900096\ntotal_swap 0\n",
    );
    write(&cg, "memory/memory.limit_in_bytes", V1_UNLIMITED);

    // kubepods: the "pods" system container.
    write(&cg, "cpuacct/kubepods/cpuacct.usage", "78435920175\n");
    write(&cg, "memory/kubepods/memory.usage_in_bytes", "22806528\n");
    write(
        &cg,
        "memory/kubepods/memory.stat",
        "pgfault 0\npgmajfault 0\ntotal_rss 536576\ntotal_inactive_file 8192\ntotal_swap 0\n",
    );
    write(&cg, "memory/kubepods/memory.limit_in_bytes", "25276514304\n");

    // The pod cgroup: no tasks of its own, so pgfault is 0 (cAdvisor reads the local one).
    let pod = POD_CG;
    write(&cg, &format!("cpuacct{pod}/cpuacct.usage"), "35392488\n");
    write(&cg, &format!("memory{pod}/memory.usage_in_bytes"), "811008\n");
    write(
        &cg,
        &format!("memory{pod}/memory.stat"),
        "pgfault 0\npgmajfault 0\ntotal_rss 102400\ntotal_inactive_file 0\ntotal_pgfault 9999\ntotal_swap 0\n",
    );
    write(&cg, &format!("memory{pod}/memory.limit_in_bytes"), V1_UNLIMITED);
    write(&cg, &format!("memory{pod}/memory.memsw.limit_in_bytes"), V1_UNLIMITED);
    write(&cg, &format!("memory{pod}/memory.soft_limit_in_bytes"), V1_UNLIMITED);
    write(&cg, &format!("cpu{pod}/cpu.shares"), "307\n");
    write(&cg, &format!("cpu{pod}/cpu.cfs_period_us"), "100000\n");
    write(&cg, &format!("cpu{pod}/cgroup.procs"), "");
    write(&cg, &format!("pids{pod}/pids.max"), "max\n");

    // The sandbox: only its process matters (its network namespace).
    write(&cg, &format!("memory{pod}/sandbox1/cgroup.procs"), "4240\n");

    // c1: everything, with a limit.
    write(&cg, &format!("cpuacct{pod}/c1/cpuacct.usage"), "13282340\n");
    write(&cg, &format!("cpuacct{pod}/c1/cpuacct.stat"), "user 1\nsystem 0\n");
    write(&cg, &format!("cpu{pod}/c1/cpu.stat"), "nr_periods 10\nnr_throttled 2\nthrottled_time 5000000\n");
    write(&cg, &format!("memory{pod}/c1/memory.usage_in_bytes"), "499712\n");
    write(
        &cg,
        &format!("memory{pod}/c1/memory.stat"),
        "cache 400000\nrss 53248\npgfault 744\npgmajfault 2\ninactive_file 4096\ntotal_cache 400000\ntotal_rss 53248\ntotal_mapped_file 8192\ntotal_inactive_file 4096\ntotal_swap 0\ntotal_pgfault 744\n",
    );
    write(&cg, &format!("memory{pod}/c1/memory.limit_in_bytes"), "268435456\n");
    write(&cg, &format!("memory{pod}/c1/memory.memsw.limit_in_bytes"), V1_UNLIMITED);
    write(&cg, &format!("memory{pod}/c1/memory.max_usage_in_bytes"), "600000\n");
    write(&cg, &format!("memory{pod}/c1/memory.failcnt"), "0\n");
    write(&cg, &format!("memory{pod}/c1/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
    write(&cg, &format!("memory{pod}/c1/cgroup.procs"), "4242\n4243\n");
    write(&cg, &format!("pids{pod}/c1/pids.current"), "5\n");
    write(&cg, &format!("pids{pod}/c1/pids.max"), "1024\n");
    write(&cg, &format!("cpu{pod}/c1/cpu.shares"), "102\n");
    write(&cg, &format!("cpu{pod}/c1/cpu.cfs_period_us"), "50000\n");
    write(&cg, &format!("cpu{pod}/c1/cgroup.procs"), "4242\n4243\n");
    write(&cg, &format!("memory{pod}/c1/memory.soft_limit_in_bytes"), "67108864\n");
    write(&cg, &format!("unified{pod}/c1/cpu.pressure"), PSI);

    // c2: more inactive file pages than usage (the working set floors at 0).
    write(&cg, &format!("cpuacct{pod}/c2/cpuacct.usage"), "1000\n");
    write(&cg, &format!("memory{pod}/c2/memory.usage_in_bytes"), "1000\n");
    write(
        &cg,
        &format!("memory{pod}/c2/memory.stat"),
        "total_inactive_file 5000\ntotal_rss 0\npgfault 1\npgmajfault 0\n",
    );
    write(&cg, &format!("memory{pod}/c2/cgroup.procs"), "4250\n");

    // c3: no memory.stat, no cpuacct.stat, no limit files.
    write(&cg, &format!("cpuacct{pod}/c3/cpuacct.usage"), "2000\n");
    write(&cg, &format!("memory{pod}/c3/memory.usage_in_bytes"), "4096\n");

    let hierarchies = CgroupHierarchies::detect(&cg).unwrap();
    let (clock, now) = test_clock(at(T0, 123));
    let mut config = CollectorConfig::new(hierarchies);
    config.proc_root = proc_root.clone();
    config.sys_root = root.join("sys");
    let collector = Collector::with_clock(config, clock);
    let inventory = inventory(&root, true);
    Fixture { _dir: dir, root, cg, proc_root, now, collector, inventory }
}

fn v2_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let cg = root.join("cgroup");
    let proc_root = root.join("proc");
    write_proc(&proc_root);
    write_node_files(&root);
    write(&cg, "cgroup.controllers", "cpuset cpu io memory hugetlb pids\n");
    // The root has no cpu.weight, cpu.max, memory.min or pids.max; its own processes.
    write(&cg, "cgroup.procs", "1\n2\n");
    // The root has cpu.stat and memory.stat but no memory.current.
    write(&cg, "cpu.stat", "usage_usec 50000000\nuser_usec 30000000\nsystem_usec 20000000\n");
    write(
        &cg,
        "memory.stat",
        "anon 1000000\nfile 3000000\nfile_mapped 10000\ninactive_file 2000000\npgfault 10\npgmajfault 1\n",
    );

    write(&cg, "kubepods/cpu.stat", "usage_usec 40000000\nuser_usec 30000000\nsystem_usec 10000000\n");
    write(&cg, "kubepods/memory.current", "2000000\n");
    write(&cg, "kubepods/memory.stat", "anon 1500000\nfile 500000\ninactive_file 100000\npgfault 5\npgmajfault 0\n");
    write(&cg, "kubepods/memory.max", "25276514304\n");

    let pod = POD_CG;
    write(&cg, &format!("{pod}/cpu.stat"), "usage_usec 35392\nuser_usec 20000\nsystem_usec 15392\n");
    write(&cg, &format!("{pod}/memory.current"), "811008\n");
    write(&cg, &format!("{pod}/memory.stat"), "anon 102400\nfile 700000\ninactive_file 0\npgfault 800\npgmajfault 0\n");
    write(&cg, &format!("{pod}/memory.max"), "max\n");
    write(&cg, &format!("{pod}/memory.swap.current"), "0\n");
    write(&cg, &format!("{pod}/memory.swap.max"), "max\n");
    write(&cg, &format!("{pod}/io.pressure"), PSI);
    write(&cg, &format!("{pod}/cpu.weight"), "12\n");
    write(&cg, &format!("{pod}/cpu.max"), "max 100000\n");
    write(&cg, &format!("{pod}/memory.min"), "0\n");
    write(&cg, &format!("{pod}/pids.max"), "max\n");
    write(&cg, &format!("{pod}/cgroup.procs"), "");
    write(&cg, &format!("{pod}/sandbox1/cgroup.procs"), "4240\n");

    write(
        &cg,
        &format!("{pod}/c1/cpu.stat"),
        "usage_usec 13282\nuser_usec 10000\nsystem_usec 3282\nnr_periods 10\nnr_throttled 2\nthrottled_usec 5000\n",
    );
    write(&cg, &format!("{pod}/c1/memory.current"), "499712\n");
    write(
        &cg,
        &format!("{pod}/c1/memory.stat"),
        "anon 53248\nfile 400000\nfile_mapped 8192\ninactive_file 4096\npgfault 744\npgmajfault 2\n",
    );
    write(&cg, &format!("{pod}/c1/memory.max"), "268435456\n");
    write(&cg, &format!("{pod}/c1/memory.peak"), "600000\n");
    write(&cg, &format!("{pod}/c1/memory.events"), "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n");
    write(&cg, &format!("{pod}/c1/memory.swap.current"), "4096\n");
    write(&cg, &format!("{pod}/c1/memory.swap.max"), "1048576\n");
    write(&cg, &format!("{pod}/c1/pids.current"), "5\n");
    write(&cg, &format!("{pod}/c1/pids.max"), "1024\n");
    write(&cg, &format!("{pod}/c1/cpu.weight"), "39\n");
    write(&cg, &format!("{pod}/c1/cpu.max"), "50000 100000\n");
    write(&cg, &format!("{pod}/c1/memory.min"), "33554432\n");
    write(&cg, &format!("{pod}/c1/cgroup.procs"), "4242\n4243\n");
    write(&cg, &format!("{pod}/c1/cpu.pressure"), PSI);
    write(&cg, &format!("{pod}/c1/memory.pressure"), PSI);
    write(&cg, &format!("{pod}/c1/io.pressure"), PSI);
    write(&cg, &format!("{pod}/c1/io.stat"), "254:0 rbytes=4096 wbytes=8192 rios=4 wios=2 dbytes=0 dios=0\n");

    write(&cg, &format!("{pod}/c2/cpu.stat"), "usage_usec 1\n");
    write(&cg, &format!("{pod}/c2/memory.current"), "1000\n");
    write(&cg, &format!("{pod}/c2/memory.stat"), "anon 0\nfile 1000\ninactive_file 5000\n");
    write(&cg, &format!("{pod}/c2/cgroup.procs"), "4250\n");

    write(&cg, &format!("{pod}/c3/cpu.stat"), "usage_usec 2\n");
    write(&cg, &format!("{pod}/c3/memory.current"), "4096\n");

    let hierarchies = CgroupHierarchies::detect(&cg).unwrap();
    assert!(hierarchies.is_v2());
    let (clock, now) = test_clock(at(T0, 123));
    let mut config = CollectorConfig::new(hierarchies);
    config.proc_root = proc_root.clone();
    config.sys_root = root.join("sys");
    let collector = Collector::with_clock(config, clock);
    let inventory = inventory(&root, true);
    Fixture { _dir: dir, root, cg, proc_root, now, collector, inventory }
}

fn pod<'a>(s: &'a Summary, name: &str) -> &'a summary::PodStats {
    s.pods.iter().find(|p| p.pod_ref.name == name).unwrap_or_else(|| panic!("pod {name} missing"))
}

fn container<'a>(p: &'a summary::PodStats, name: &str) -> &'a summary::ContainerStats {
    p.containers.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("container {name} missing"))
}

/// `du` of a tree by hand: (bytes, inodes).
fn du(path: &Path) -> (u64, u64) {
    let m = std::fs::symlink_metadata(path).unwrap();
    let mut out = (m.blocks() * 512, 1);
    if m.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            let (b, i) = du(&e.unwrap().path());
            out.0 += b;
            out.1 += i;
        }
    }
    out
}

#[test]
fn summary_sample_round_trips_without_losing_fields() {
    let original: serde_json::Value = serde_json::from_str(SUMMARY_SAMPLE).unwrap();
    let parsed: Summary = serde_json::from_str(SUMMARY_SAMPLE).unwrap();
    assert_eq!(parsed.node.node_name, "node-a");
    assert_eq!(parsed.pods.len(), 2);
    assert_eq!(parsed.node.network.as_ref().unwrap().default_interface.name, "eth0");
    let again = serde_json::to_value(&parsed).unwrap();
    assert_eq!(again, original);
    // And the text itself: same keys in the same order as the Go encoder wrote them.
    let text = serde_json::to_string_pretty(&parsed).unwrap();
    assert_eq!(text.trim(), SUMMARY_SAMPLE.trim());
}

#[test]
fn time_is_rfc3339_seconds_or_null() {
    let t = Time::from(at(T0, 999));
    assert_eq!(serde_json::to_string(&t).unwrap(), "\"2026-11-30T17:28:09Z\"");
    assert_eq!(t.unix_millis(), Some(T0 as i64 * 1000 + 999));
    assert_eq!(serde_json::to_string(&Time::zero()).unwrap(), "null");
    let back: Time = serde_json::from_str("\"2026-11-30T17:28:09Z\"").unwrap();
    assert_eq!(back, Time::from(at(T0, 0)));
    let null: Time = serde_json::from_str("null").unwrap();
    assert!(null.is_zero());
}

#[test]
fn network_without_eth0_still_writes_an_empty_name() {
    let n = summary::NetworkStats { time: Time::from(at(T0, 0)), ..Default::default() };
    assert_eq!(serde_json::to_string(&n).unwrap(), r#"{"time":"2026-11-30T17:28:09Z","name":""}"#);
}

#[test]
fn v1_hierarchies_are_detected() {
    let f = v1_fixture();
    let CgroupHierarchies::V1 { cpuacct, cpu, memory, pids, blkio, unified } = f.collector.config().cgroups.clone()
    else {
        panic!("not v1")
    };
    assert_eq!(cpuacct, f.cg.join("cpuacct"));
    assert_eq!(cpu, Some(f.cg.join("cpu")));
    assert_eq!(memory, f.cg.join("memory"));
    assert_eq!(pids, Some(f.cg.join("pids")));
    assert_eq!(blkio, Some(f.cg.join("blkio")));
    assert_eq!(unified, Some(f.cg.join("unified")));
}

#[test]
fn v1_container_pod_and_node_numbers() {
    let mut f = v1_fixture();
    let c = f.collect();
    let s = c.summary();

    // Node: root cgroup, MemTotal for the limit, boot time from /proc/stat.
    let node = &s.node;
    assert_eq!(node.node_name, "node-a");
    assert_eq!(node.start_time, Time::from(at(1_796_054_408, 0)));
    let cpu = node.cpu.as_ref().unwrap();
    assert_eq!(cpu.usage_core_nano_seconds, Some(5_028_767_409_292));
    assert_eq!(cpu.usage_nano_cores, None, "no rate on the first pass");
    let mem = node.memory.as_ref().unwrap();
    assert_eq!(mem.usage_bytes, Some(1_642_434_560));
    assert_eq!(mem.working_set_bytes, Some(1_642_434_560 - 528_900_096));
    assert_eq!(mem.rss_bytes, Some(487_071_744));
    assert_eq!(mem.page_faults, Some(121_269));
    assert_eq!(mem.available_bytes, Some(25_165_824 * 1024 - (1_642_434_560 - 528_900_096)));
    let swap = node.swap.as_ref().unwrap();
    assert_eq!((swap.swap_available_bytes, swap.swap_usage_bytes), (Some(0), Some(0)));
    let rlimit = node.rlimit.as_ref().unwrap();
    assert_eq!((rlimit.max_pid, rlimit.num_of_running_processes), (Some(32768), Some(386)));
    let net = node.network.as_ref().unwrap();
    let names: Vec<&str> = net.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["ifb0", "eth0"], "lo and veths are ignored, file order kept");
    assert_eq!(net.default_interface.rx_bytes, Some(569_474_224));
    let fs = node.fs.as_ref().unwrap();
    assert!(fs.capacity_bytes.unwrap() > 0 && fs.inodes.is_some() && fs.used_bytes.is_some());
    let image_fs = node.runtime.as_ref().unwrap().image_fs.as_ref().unwrap();
    assert_eq!((image_fs.used_bytes, image_fs.inodes_used), (Some(2_125_824), Some(69)));
    assert_eq!(image_fs.capacity_bytes, fs.capacity_bytes);
    assert!(node.io.is_some(), "node PSI from /proc/pressure");

    // The pods system container.
    assert_eq!(node.system_containers.len(), 1);
    let pods = &node.system_containers[0];
    assert_eq!(pods.name, "pods");
    assert!(!pods.start_time.is_zero());
    let pm = pods.memory.as_ref().unwrap();
    assert_eq!(pm.working_set_bytes, Some(22_806_528 - 8192));
    assert_eq!(pm.available_bytes, Some(25_276_514_304 - (22_806_528 - 8192)));
    assert_eq!(pods.swap.as_ref().unwrap().swap_usage_bytes, Some(0));

    // Pods: the ghost pod (only a vanished container) is left out.
    assert_eq!(s.pods.len(), 1);
    let p = pod(&s, "web");
    assert_eq!(p.pod_ref.uid, POD_UID);
    assert_eq!(p.pod_ref.namespace, "nodebench");
    assert_eq!(p.start_time, Time::from(at(T0 - 70, 250)));
    let names: Vec<&str> = p.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["app", "sidecar", "bare"], "the vanished container is skipped");
    let pm = p.memory.as_ref().unwrap();
    assert_eq!((pm.usage_bytes, pm.working_set_bytes, pm.rss_bytes), (Some(811_008), Some(811_008), Some(102_400)));
    assert_eq!(pm.page_faults, Some(0), "v1 page faults are the cgroup's own, as cAdvisor reads them");
    assert_eq!(pm.available_bytes, None, "no limit, no availableBytes");
    assert_eq!(p.cpu.as_ref().unwrap().usage_core_nano_seconds, Some(35_392_488));
    assert_eq!(p.process_stats.as_ref().unwrap().process_count, Some(3));
    let swap = p.swap.as_ref().unwrap();
    assert_eq!((swap.swap_usage_bytes, swap.swap_available_bytes), (Some(0), None));

    // Network of the sandbox's namespace.
    let net = p.network.as_ref().unwrap();
    assert_eq!(net.interfaces.len(), 1);
    assert_eq!(net.default_interface.name, "eth0");
    assert_eq!(
        (
            net.default_interface.rx_bytes,
            net.default_interface.rx_errors,
            net.default_interface.tx_bytes,
            net.default_interface.tx_errors
        ),
        (Some(1296), Some(1), Some(752), Some(2))
    );

    // app: working set = usage - total_inactive_file; availableBytes = limit - working set.
    let app = container(p, "app");
    assert_eq!(app.start_time, Time::from(at(T0 - 70, 500)));
    let m = app.memory.as_ref().unwrap();
    assert_eq!(m.usage_bytes, Some(499_712));
    assert_eq!(m.working_set_bytes, Some(499_712 - 4096));
    assert_eq!(m.rss_bytes, Some(53_248));
    assert_eq!((m.page_faults, m.major_page_faults), (Some(744), Some(2)));
    assert_eq!(m.available_bytes, Some(268_435_456 - (499_712 - 4096)));
    assert!(m.psi.is_none(), "no memory.pressure for app");
    let cpu = app.cpu.as_ref().unwrap();
    assert_eq!(cpu.usage_core_nano_seconds, Some(13_282_340));
    let psi = cpu.psi.as_ref().unwrap();
    assert_eq!((psi.some.avg10, psi.some.total, psi.full.total), (1.5, 123_456, 789));
    assert_eq!(app.swap.as_ref().unwrap().swap_usage_bytes, Some(0));

    // Raw numbers kept for /metrics/cadvisor.
    let raw = &c.pods[0].containers[0].stats;
    let rm = raw.memory.as_ref().unwrap();
    assert_eq!(
        (rm.cache, rm.mapped_file, rm.max_usage, rm.failcnt, rm.oom_kills),
        (Some(400_000), Some(8192), Some(600_000), Some(0), Some(3))
    );
    assert_eq!(rm.limit, Some(268_435_456));
    assert_eq!(rm.swap_limit, None, "memsw unlimited");
    let rc = raw.cpu.as_ref().unwrap();
    assert_eq!((rc.user_ns, rc.system_ns), (Some(10_000_000), Some(0)));
    assert_eq!(rc.throttling.map(|t| (t.periods, t.throttled_periods, t.throttled_ns)), Some((10, 2, 5_000_000)));
    assert_eq!((raw.tasks, raw.processes, raw.first_pid), (Some(5), Some(2), Some(4242)));

    // sidecar: inactive_file above usage floors the working set at 0.
    let sidecar = container(p, "sidecar");
    assert_eq!(sidecar.memory.as_ref().unwrap().working_set_bytes, Some(0));

    // bare: missing files leave fields out instead of reporting zeros.
    let bare = container(p, "bare");
    let m = bare.memory.as_ref().unwrap();
    assert_eq!(m.usage_bytes, Some(4096));
    assert_eq!((m.working_set_bytes, m.rss_bytes, m.page_faults, m.available_bytes), (None, None, None, None));
    assert_eq!(bare.cpu.as_ref().unwrap().usage_core_nano_seconds, Some(2000));
    assert!(bare.logs.is_none(), "no log dir");
    let json = serde_json::to_value(bare).unwrap();
    assert!(json["memory"].get("workingSetBytes").is_none(), "{json}");
    assert!(json["memory"].get("rssBytes").is_none(), "{json}");
}

#[test]
fn filesystem_logs_volumes_and_ephemeral_storage() {
    let mut f = v1_fixture();
    // The first pass only registers writable layers and volumes: nothing walked yet.
    let s = f.collect().summary();
    let p = pod(&s, "web");
    let rootfs = container(p, "app").rootfs.clone().unwrap();
    assert!(rootfs.capacity_bytes.is_some() && rootfs.used_bytes.is_none(), "{rootfs:?}");
    assert!(p.volume_stats.is_empty());
    assert_eq!(f.collector.fs_usage().walks(), 0, "a pass never walks");
    // The background walk: both layers (c1 named, c2 found), three volumes.
    assert_eq!(f.refresh_fs(), 5);
    let s = f.collect().summary();
    let p = pod(&s, "web");
    let root_fs = s.node.fs.clone().unwrap();

    let app = container(p, "app");
    let rootfs = app.rootfs.as_ref().unwrap();
    let layer = du(&f.root.join("layers/c1"));
    assert_eq!((rootfs.used_bytes, rootfs.inodes_used), (Some(layer.0), Some(layer.1)));
    assert_eq!(layer.1, 3, "dir, etc, motd");
    let image_fs = s.node.runtime.as_ref().unwrap().image_fs.as_ref().unwrap();
    assert_eq!(rootfs.capacity_bytes, image_fs.capacity_bytes, "the image filesystem's capacity");
    assert_eq!(rootfs.inodes, image_fs.inodes);
    let logs = app.logs.as_ref().unwrap();
    let log_dir = f.root.join("var/log/pods/nodebench_web_fcda0808-b6d1-42dd-b8ec-a4159717362c/app");
    let files: u64 = std::fs::read_dir(&log_dir).unwrap().map(|e| e.unwrap().metadata().unwrap().blocks() * 512).sum();
    assert_eq!((logs.used_bytes, logs.inodes_used), (Some(files), Some(2)), "files only, not the directory");
    assert_eq!(logs.available_bytes, root_fs.available_bytes);
    assert_eq!(logs.capacity_bytes, root_fs.capacity_bytes);

    // sidecar: an empty log directory (usage unknown, as upstream adds nothing), and a
    // writable layer found as the upper dir of its process's root overlay.
    let sidecar = container(p, "sidecar");
    let logs = sidecar.logs.as_ref().unwrap();
    assert_eq!((logs.used_bytes, logs.inodes_used), (None, None));
    let sidecar_layer = du(&f.root.join("layers/c2"));
    let rootfs = sidecar.rootfs.as_ref().unwrap();
    assert_eq!((rootfs.used_bytes, rootfs.inodes_used), (Some(sidecar_layer.0), Some(3)));
    // bare: no process, no layer: capacity only.
    let rootfs = container(p, "bare").rootfs.as_ref().unwrap();
    assert!(rootfs.capacity_bytes.is_some() && rootfs.used_bytes.is_none());

    // Volumes: local ephemeral first; an unreadable one is left out.
    let names: Vec<&str> = p.volume_stats.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["scratch", "sec"]);
    let scratch = du(&f.root.join("volumes/scratch"));
    assert_eq!((p.volume_stats[0].fs.used_bytes, p.volume_stats[0].fs.inodes_used), (Some(scratch.0), Some(2)));

    // Ephemeral storage: writable layers + logs + local ephemeral volumes + etc-hosts.
    let etc_hosts = du(&f.root.join("var/lib/kubelet/pods/uid/etc-hosts"));
    let e = p.ephemeral_storage.as_ref().unwrap();
    assert_eq!(e.used_bytes, Some(layer.0 + files + sidecar_layer.0 + scratch.0 + etc_hosts.0));
    assert_eq!(e.inodes_used, Some(layer.1 + 2 + 3 + 2 + 1));
    assert_eq!(e.capacity_bytes, root_fs.capacity_bytes);

    // A grown layer is seen after its next walk only, never by a pass.
    write(&f.root, "layers/c1/new", &"n".repeat(50_000));
    f.advance(Duration::from_secs(10));
    let s = f.collect().summary();
    assert_eq!(container(pod(&s, "web"), "app").rootfs.as_ref().unwrap().inodes_used, Some(3));
    assert_eq!(f.refresh_fs(), 0, "not due before the interval");
    f.collector.fs_usage().measure(&f.root.join("layers/c1"));
    let s = f.collect().summary();
    let rootfs = container(pod(&s, "web"), "app").rootfs.clone().unwrap();
    assert_eq!(rootfs.inodes_used, Some(4));
    assert_eq!(rootfs.time, Time::from(at(T0 + 10, 123)), "the walk's time");

    // Gone containers and volumes are forgotten.
    f.inventory.pods[0].containers.truncate(1);
    f.inventory.pods[0].volumes.clear();
    f.collect();
    assert_eq!(f.collector.fs_usage().len(), 1);
}

/// A CSI driver's answers by volume id: figures, "not supported", or an error.
#[derive(Default)]
struct FakeVolumeStats {
    answers: Mutex<BTreeMap<String, Result<Option<DriverVolumeStats>, String>>>,
    asked: Mutex<Vec<(String, PathBuf)>>,
}

impl VolumeStatsSource for FakeVolumeStats {
    fn volume_stats(&self, volume: &DriverVolume, path: &Path) -> Result<Option<DriverVolumeStats>, String> {
        self.asked.lock().unwrap().push((volume.volume_id.clone(), path.to_owned()));
        self.answers.lock().unwrap().get(&volume.volume_id).cloned().unwrap_or(Ok(None))
    }
}

#[test]
fn csi_volumes_take_their_figures_from_the_driver_and_are_never_walked() {
    let mut f = v1_fixture();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(super::metrics::VolumeStatMetrics::new(&mut registry));
    let source = Arc::new(FakeVolumeStats::default());
    let figures = DriverVolumeStats {
        fs: fs::FsInfo { capacity: 10 << 20, available: (10 << 20) - 4096, usage: 4096, inodes: 100, inodes_free: 97 },
        usage: fs::DiskUsage { bytes: 4096, inodes: 3 },
    };
    source.answers.lock().unwrap().insert("vol-fs".into(), Ok(Some(figures)));
    source.answers.lock().unwrap().insert(
        "vol-block".into(),
        Ok(Some(DriverVolumeStats {
            fs: fs::FsInfo { capacity: 5 << 20, ..fs::FsInfo::default() },
            usage: fs::DiskUsage::default(),
        })),
    );
    source.answers.lock().unwrap().insert("vol-broken".into(), Err("rpc error: code = Internal".into()));
    // A fresh cache with metrics and the source (the fixture's has neither).
    let cache = f.collector.fs_usage();
    cache.set_volume_stats_source(source.clone());
    let metered = FsUsageCache::new(FsUsageConfig::default(), Arc::new(SystemTime::now)).with_metrics(Some(metrics));
    metered.set_volume_stats_source(source.clone());

    let csi = |name: &str, id: &str, claim: Option<&str>| VolumeInventory {
        name: name.to_owned(),
        // The publish target; none of these exist: nothing could be walked.
        path: f.root.join(format!("pods/uid/volumes/kubernetes.io~csi/{name}/mount")),
        local_ephemeral: false,
        pvc: claim.map(|c| summary::PvcReference { name: c.to_owned(), namespace: "nodebench".to_owned() }),
        driver: Some(DriverVolume { driver: "hostpath.csi.test".to_owned(), volume_id: id.to_owned() }),
    };
    f.inventory.pods[0].volumes = vec![
        csi("data", "vol-fs", Some("data-claim")),
        csi("raw", "vol-block", Some("raw-claim")),
        csi("nostats", "vol-unsupported", None),
        csi("broken", "vol-broken", None),
    ];
    let s = f.collect().summary();
    assert!(pod(&s, "web").volume_stats.is_empty(), "nothing measured yet");
    assert!(source.asked.lock().unwrap().is_empty(), "a pass never asks the driver");
    assert_eq!(f.refresh_fs(), 6, "two layers walked, four volumes asked");
    let asked: Vec<String> = source.asked.lock().unwrap().iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(asked.len(), 4, "{asked:?}");
    assert!(source.asked.lock().unwrap().iter().any(|(id, p)| id == "vol-fs" && p.ends_with("data/mount")));

    let s = f.collect().summary();
    let p = pod(&s, "web");
    let names: Vec<&str> = p.volume_stats.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["data", "raw"], "no figures without stats support or after an error");
    let data = &p.volume_stats[0];
    assert_eq!(data.fs.capacity_bytes, Some(10 << 20));
    assert_eq!(data.fs.available_bytes, Some((10 << 20) - 4096));
    assert_eq!(data.fs.used_bytes, Some(4096));
    assert_eq!((data.fs.inodes, data.fs.inodes_free, data.fs.inodes_used), (Some(100), Some(97), Some(3)));
    assert_eq!(data.pvc_ref.as_ref().map(|r| r.name.as_str()), Some("data-claim"));
    assert_eq!(p.volume_stats[1].fs.capacity_bytes, Some(5 << 20));

    // The driver's answer changes: seen after the next measurement only.
    source.answers.lock().unwrap().get_mut("vol-fs").unwrap().as_mut().unwrap().as_mut().unwrap().usage.bytes = 8192;
    assert_eq!(f.refresh_fs(), 0, "not due before the interval");
    cache.measure(&f.root.join("pods/uid/volumes/kubernetes.io~csi/data/mount"));
    let s = f.collect().summary();
    assert_eq!(pod(&s, "web").volume_stats[0].fs.used_bytes, Some(8192));

    // Each call to the driver is timed with the driver's name as its source.
    let path = f.root.join("x");
    let v = DriverVolume { driver: "hostpath.csi.test".to_owned(), volume_id: "vol-fs".to_owned() };
    assert!(metered.get_from_driver(&path, &v).is_none());
    assert_eq!(metered.refresh_due(), 1);
    assert!(metered.get_from_driver(&path, &v).is_some());
    assert_eq!(metered.walks(), 0, "asked, not walked");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("kubelet_volume_metric_collection_duration_seconds_count{metric_source=\"hostpath.csi.test\"} 1"),
        "{text}"
    );
}

/// `kubelet_volume_metric_collection_duration_seconds_count{metric_source="du"}`.
fn du_observations(registry: &prometheus_client::registry::Registry) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("kubelet_volume_metric_collection_duration_seconds_count{metric_source=\"du\"} "))
        .map_or(0, |v| v.parse().unwrap())
}

#[test]
fn every_du_is_timed_in_the_volume_metric() {
    let mut f = v1_fixture();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(super::metrics::VolumeStatMetrics::new(&mut registry));
    let mut config = f.collector.config().clone();
    config.metrics = Some(Arc::clone(&metrics));
    f.collector = Collector::new(config);
    assert_eq!(du_observations(&registry), 0, "no series before the first measurement");
    f.collect();
    // The pass lists the log directories of the pod and its two containers that have one,
    // and measures etc-hosts.
    let listed = du_observations(&registry);
    assert_eq!(listed, 4);
    // The background walks: two writable layers, three volumes.
    assert_eq!(f.refresh_fs(), 5);
    assert_eq!(du_observations(&registry), listed + 5);
}

/// A lean collection (the eviction manager's while nobody reads the stats) gives the
/// eviction manager what a full one does, without what only readers see, and leaves the
/// CPU samples to the full collections: their rates span the time between them.
#[test]
fn lean_collections_see_what_eviction_reads_and_leave_cpu_rates_alone() {
    let mut f = v1_fixture();
    let full = f.collect();
    f.collector.set_lean(true);
    let lean = f.collect();
    assert!(lean.lean && !full.lean);
    let eviction = |c: &Collection| crate::eviction::NodeSnapshot::from_summary(&c.summary(), false);
    let (from_lean, from_full) = (eviction(&lean), eviction(&full));
    assert!(from_lean.pods.iter().any(|p| p.memory_working_set_bytes.is_some()), "{from_lean:?}");
    assert!(from_lean.allocatable_memory.is_some() && from_lean.memory.is_some());
    // (The filesystems are the host's live ones: their free space moves between passes.)
    assert_eq!(format!("{:?}", from_lean.pods), format!("{:?}", from_full.pods));
    assert_eq!(
        (from_lean.memory, from_lean.allocatable_memory, from_lean.pids),
        (from_full.memory, from_full.allocatable_memory, from_full.pids)
    );
    assert_eq!(from_lean.node_fs.map(|f| f.capacity_bytes), from_full.node_fs.map(|f| f.capacity_bytes));
    let app = |c: &Collection| {
        let pod = c.pods.iter().find(|p| p.name == "web").unwrap();
        pod.containers.iter().find(|c| c.name == "app").unwrap().stats.clone()
    };
    assert!(app(&full).cpu.is_some() && app(&lean).cpu.is_none(), "no CPU in a lean collection");
    assert!(app(&full).memory.unwrap().failcnt.is_some() && app(&lean).memory.unwrap().failcnt.is_none());
    assert!(app(&lean).cpu_pressure.is_none() && lean.node.network.is_none() && lean.node.filesystems.is_empty());

    // 10 s after the full pass, with a lean one between: the rate spans the 10 s.
    f.collector.set_lean(false);
    f.advance(Duration::from_secs(10));
    f.set_v1_cpu(&format!("{POD_CG}/c1"), 13_282_340 + 2_500_000_000);
    let second = f.collect().summary();
    assert_eq!(container(pod(&second, "web"), "app").cpu.as_ref().unwrap().usage_nano_cores, Some(250_000_000));
}

#[test]
fn usage_nano_cores_comes_from_two_samples() {
    let mut f = v1_fixture();
    let first = f.collect().summary();
    assert!(container(pod(&first, "web"), "app").cpu.as_ref().unwrap().usage_nano_cores.is_none());
    assert!(pod(&first, "web").cpu.as_ref().unwrap().usage_nano_cores.is_none());

    // 10 s later, app used 2.5 s of CPU: 0.25 cores; the node used 5 s: 0.5 cores.
    f.advance(Duration::from_secs(10));
    f.set_v1_cpu(&format!("{POD_CG}/c1"), 13_282_340 + 2_500_000_000);
    f.set_v1_cpu("", 5_028_767_409_292 + 5_000_000_000);
    let second = f.collect().summary();
    let app = container(pod(&second, "web"), "app");
    assert_eq!(app.cpu.as_ref().unwrap().usage_nano_cores, Some(250_000_000));
    assert_eq!(second.node.cpu.as_ref().unwrap().usage_nano_cores, Some(500_000_000));
    assert_eq!(container(pod(&second, "web"), "sidecar").cpu.as_ref().unwrap().usage_nano_cores, Some(0));

    // An on-demand pass 200 ms later keeps the last rate and the 10 s base.
    f.advance(Duration::from_millis(200));
    f.set_v1_cpu(&format!("{POD_CG}/c1"), 13_282_340 + 2_600_000_000);
    let third = f.collect().summary();
    assert_eq!(container(pod(&third, "web"), "app").cpu.as_ref().unwrap().usage_nano_cores, Some(250_000_000));

    // The next periodic pass measures from the 10 s sample: 1 s of CPU in 10 s.
    f.advance(Duration::from_millis(9800));
    f.set_v1_cpu(&format!("{POD_CG}/c1"), 13_282_340 + 3_500_000_000);
    let fourth = f.collect().summary();
    assert_eq!(container(pod(&fourth, "web"), "app").cpu.as_ref().unwrap().usage_nano_cores, Some(100_000_000));

    // A counter that went back (the cgroup was recreated) restarts without a rate.
    f.advance(Duration::from_secs(10));
    f.set_v1_cpu(&format!("{POD_CG}/c1"), 1000);
    let fifth = f.collect().summary();
    assert_eq!(container(pod(&fifth, "web"), "app").cpu.as_ref().unwrap().usage_nano_cores, None);
}

#[test]
fn a_container_vanishing_between_passes_is_skipped() {
    let mut f = v1_fixture();
    assert_eq!(f.collect().pods[0].containers.len(), 3);
    for h in ["cpuacct", "memory", "cpu", "pids", "unified"] {
        let _ = std::fs::remove_dir_all(f.cg.join(h).join(POD_CG.trim_start_matches('/')).join("c2"));
    }
    let c = f.collect();
    let names: Vec<&str> = c.pods[0].containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["app", "bare"]);
}

#[test]
fn v2_numbers_psi_and_root_memory() {
    let mut f = v2_fixture();
    let c = f.collect();
    let s = c.summary();

    // Root: usage = anon + file, working set = usage - inactive_file.
    let mem = s.node.memory.as_ref().unwrap();
    assert_eq!(
        (mem.usage_bytes, mem.working_set_bytes, mem.rss_bytes),
        (Some(4_000_000), Some(2_000_000), Some(1_000_000))
    );
    assert_eq!(s.node.cpu.as_ref().unwrap().usage_core_nano_seconds, Some(50_000_000_000));

    let pods = &s.node.system_containers[0];
    assert_eq!(pods.memory.as_ref().unwrap().available_bytes, Some(25_276_514_304 - 1_900_000));

    let p = pod(&s, "web");
    assert_eq!(p.cpu.as_ref().unwrap().usage_core_nano_seconds, Some(35_392_000));
    let pm = p.memory.as_ref().unwrap();
    assert_eq!((pm.working_set_bytes, pm.page_faults, pm.available_bytes), (Some(811_008), Some(800), None));
    let io = p.io.as_ref().unwrap();
    assert_eq!(io.psi.as_ref().unwrap().some.avg60, 0.25);

    let app = container(p, "app");
    let m = app.memory.as_ref().unwrap();
    assert_eq!((m.usage_bytes, m.working_set_bytes, m.rss_bytes), (Some(499_712), Some(499_712 - 4096), Some(53_248)));
    assert_eq!(m.available_bytes, Some(268_435_456 - (499_712 - 4096)));
    assert!(m.psi.is_some());
    let swap = app.swap.as_ref().unwrap();
    assert_eq!((swap.swap_usage_bytes, swap.swap_available_bytes), (Some(4096), Some(1_048_576 - 4096)));
    assert!(app.io.is_some());

    let raw = &c.pods[0].containers[0].stats;
    let rm = raw.memory.as_ref().unwrap();
    assert_eq!(
        (rm.oom_kills, rm.max_usage, rm.cache, rm.mapped_file),
        (Some(1), Some(600_000), Some(400_000), Some(8192))
    );
    let rc = raw.cpu.as_ref().unwrap();
    assert_eq!((rc.total_ns, rc.user_ns, rc.system_ns), (13_282_000, Some(10_000_000), Some(3_282_000)));
    assert_eq!(rc.throttling.map(|t| t.throttled_ns), Some(5_000_000));

    // PSI JSON shape.
    let json = serde_json::to_value(app).unwrap();
    assert_eq!(
        json["cpu"]["psi"]["some"],
        serde_json::json!({"total": 123_456, "avg10": 1.5, "avg60": 0.25, "avg300": 0})
    );
    assert_eq!(json["io"]["psi"]["full"]["total"], 789);

    assert_eq!(container(p, "sidecar").memory.as_ref().unwrap().working_set_bytes, Some(0));
    let bare = container(p, "bare").memory.clone().unwrap();
    assert_eq!((bare.working_set_bytes, bare.rss_bytes), (None, None));

    // Rates on v2 too.
    f.advance(Duration::from_secs(10));
    write(&f.cg, &format!("{POD_CG}/c1/cpu.stat"), "usage_usec 1013282\n");
    let s = f.collect().summary();
    assert_eq!(container(pod(&s, "web"), "app").cpu.as_ref().unwrap().usage_nano_cores, Some(100_000_000));
}

#[test]
fn network_falls_back_to_a_container_process() {
    let mut f = v1_fixture();
    f.inventory.pods[0].sandbox_cgroup = None;
    write(&f.proc_root, "4242/net/dev", NET_DEV);
    let s = f.collect().summary();
    assert_eq!(pod(&s, "web").network.as_ref().unwrap().default_interface.tx_bytes, Some(752));
}

#[test]
fn cpu_and_memory_summary_keeps_only_cpu_memory_and_swap() {
    let mut f = v1_fixture();
    let s = f.collect().cpu_and_memory_summary();
    let json = serde_json::to_value(&s).unwrap();
    let node: BTreeSet<&str> = json["node"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(node, BTreeSet::from(["nodeName", "systemContainers", "startTime", "cpu", "memory", "swap"]));
    let pod = json["pods"][0].as_object().unwrap();
    let keys: BTreeSet<&str> = pod.keys().map(String::as_str).collect();
    assert_eq!(keys, BTreeSet::from(["podRef", "startTime", "containers", "cpu", "memory", "swap"]));
    let c: BTreeSet<&str> = pod["containers"][0].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(c, BTreeSet::from(["name", "startTime", "cpu", "memory", "swap"]));
    assert!(json["node"]["io"].is_null() && json["pods"][0]["io"].is_null());
    assert!(json["node"]["memory"]["psi"].is_object(), "PSI is part of the memory stats");
}

#[test]
fn only_cpu_and_memory_query() {
    assert!(only_cpu_and_memory(Some("only_cpu_and_memory=true")));
    assert!(only_cpu_and_memory(Some("a=b&only_cpu_and_memory=true")));
    assert!(!only_cpu_and_memory(Some("only_cpu_and_memory=True")));
    assert!(!only_cpu_and_memory(Some("only_cpu_and_memory=true&only_cpu_and_memory=true")));
    assert!(!only_cpu_and_memory(None));
}

#[test]
fn go_float_formatting() {
    let cases: [(f64, &str); 16] = [
        (0.0, "0"),
        (1.0, "1"),
        (-1.0, "-1"),
        (0.5, "0.5"),
        (0.013_282_34, "0.01328234"),
        (5_028.767_409_292, "5028.767409292"),
        (123_456.0, "123456"),
        (1_234_567.0, "1.234567e+06"),
        (16_576_512.0, "1.6576512e+07"),
        (1e8, "1e+08"),
        (1_796_059_619.5, "1.7960596195e+09"),
        (0.0001, "0.0001"),
        (0.000_01, "1e-05"),
        (1e100, "1e+100"),
        (f64::INFINITY, "+Inf"),
        (f64::NAN, "NaN"),
    ];
    for (v, want) in cases {
        let mut s = String::new();
        write_go_float(&mut s, v);
        assert_eq!(s, want, "{v}");
    }
}

/// Go's `FormatFloat(v, 'g', -1, 64)` the slow, obvious way: the shortest digits from
/// `{:e}`, `%e` form when the exponent is < -4 or >= 6.
fn go_float_oracle(v: f64) -> String {
    if v == 0.0 {
        return "0".to_owned();
    }
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..6).contains(&exp) {
        format!("{v}")
    } else {
        let fraction = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        let e = if exp < 0 { '-' } else { '+' };
        format!("{sign}{}{fraction}e{e}{:02}", &digits[..1], exp.abs())
    }
}

#[test]
fn go_float_agrees_with_the_obvious_formatting() {
    let mut values =
        vec![1e15, 9_007_199_254_740_991.0, 9_007_199_254_740_992.0, 9_007_199_254_740_994.0, 1e21, 5e-324];
    for e in -30..30 {
        let p = 10f64.powi(e);
        values.extend([p, 3.0 * p, 1.5 * p, p * (1.0 + f64::EPSILON), p * 0.999_999]);
    }
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        values.extend([
            f64::from_bits(x),
            (x >> 11) as f64,
            (x % 100_000_000_000) as f64,
            (x % 10_000_000) as f64 / 1e9,
        ]);
    }
    for v in values.into_iter().filter(|v| v.is_finite()) {
        for v in [v, -v] {
            let mut ours = String::new();
            write_go_float(&mut ours, v);
            assert_eq!(ours, go_float_oracle(v), "{v:e}");
        }
    }
}

/// One family of the text format: TYPE, HELP and its samples.
#[derive(Debug, Default)]
struct Parsed {
    kind: String,
    help: String,
    samples: Vec<(BTreeMap<String, String>, String, Option<i64>)>,
}

fn parse_text(text: &str) -> BTreeMap<String, Parsed> {
    let mut out: BTreeMap<String, Parsed> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            out.entry(name.to_owned()).or_default().help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.entry(name.to_owned()).or_default().kind = kind.to_owned();
        } else {
            let (series, rest) = if let Some((name, rest)) = line.split_once('{') {
                let (labels, rest) = rest.split_once('}').unwrap();
                (name, (labels, rest.trim()))
            } else {
                let (name, rest) = line.split_once(' ').unwrap();
                (name, ("", rest))
            };
            let labels = rest
                .0
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (k, v) = l.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            let mut fields = rest.1.split(' ');
            let value = fields.next().unwrap().to_owned();
            let ts = fields.next().map(|t| t.parse().unwrap());
            out.get_mut(series)
                .unwrap_or_else(|| panic!("sample before TYPE: {line}"))
                .samples
                .push((labels, value, ts));
        }
    }
    out
}

fn rendered_after_two_passes() -> String {
    let mut f = v1_fixture();
    f.collect();
    f.advance(Duration::from_secs(10));
    f.collect().resource_metrics()
}

#[test]
fn resource_metrics_match_the_kubelet_inventory() {
    let text = rendered_after_two_passes();
    let ours = parse_text(&text);
    let mut reference: BTreeMap<String, (String, BTreeSet<String>, String)> = BTreeMap::new();
    for line in RESOURCE_INVENTORY.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let labels = if cols[2] == "-" { BTreeSet::new() } else { cols[2].split(',').map(str::to_owned).collect() };
        reference.insert(cols[0].to_owned(), (cols[1].to_owned(), labels, cols[4].to_owned()));
    }
    for (name, (kind, labels, help)) in &reference {
        let f = ours.get(name).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        assert_eq!(&f.kind, kind, "TYPE of {name}");
        assert_eq!(&f.help, help, "HELP of {name}");
        assert!(!f.samples.is_empty(), "{name}");
        for (l, _, _) in &f.samples {
            let names: BTreeSet<String> = l.keys().cloned().collect();
            assert_eq!(&names, labels, "labels of {name}");
        }
    }
    // The only additions: the swap families of newer kubelets.
    let extra: BTreeSet<&str> = ours.keys().filter(|k| !reference.contains_key(*k)).map(String::as_str).collect();
    assert_eq!(extra, BTreeSet::from(["container_swap_usage_bytes", "node_swap_usage_bytes", "pod_swap_usage_bytes"]));
    for name in &extra {
        let family = resource_metrics::FAMILIES.iter().find(|f| f.name == *name).unwrap();
        assert_eq!(ours[*name].kind, "gauge");
        let labels: BTreeSet<String> = family.labels.iter().map(|s| (*s).to_owned()).collect();
        for (l, _, _) in &ours[*name].samples {
            assert_eq!(l.keys().cloned().collect::<BTreeSet<_>>(), labels);
        }
    }
}

#[test]
fn resource_metrics_values_order_and_timestamps() {
    let text = rendered_after_two_passes();
    let ours = parse_text(&text);
    // Families sorted by name.
    let order: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap()).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(order, sorted);

    // Containers sorted by label values (container first), vanished ones absent.
    let cpu = &ours["container_cpu_usage_seconds_total"].samples;
    let names: Vec<&str> = cpu.iter().map(|s| s.0["container"].as_str()).collect();
    assert_eq!(names, ["app", "bare", "sidecar"]);
    assert_eq!(cpu[0].0["pod"], "web");
    assert_eq!(cpu[0].0["namespace"], "nodebench");
    assert_eq!(cpu[0].1, "0.01328234");
    // The second pass ran at T0+10s.123 (the test clock): milliseconds of the stats' time.
    let ts = (T0 + 10) as i64 * 1000 + 123;
    assert_eq!(cpu[0].2, Some(ts));

    // bare has no working set: no sample rather than a zero.
    let ws = &ours["container_memory_working_set_bytes"].samples;
    let names: Vec<&str> = ws.iter().map(|s| s.0["container"].as_str()).collect();
    assert_eq!(names, ["app", "sidecar"]);
    assert_eq!(ws[0].1, "495616");

    // Start times: seconds with the fraction, no timestamp.
    let start = &ours["container_start_time_seconds"].samples;
    assert_eq!(start[0].1, "1.7960596195e+09");
    assert_eq!(start[0].2, None);

    assert_eq!(ours["node_cpu_usage_seconds_total"].samples[0].1, "5028.767409292");
    assert_eq!(ours["node_memory_working_set_bytes"].samples[0].1, "1.113534464e+09");
    assert_eq!(ours["pod_memory_working_set_bytes"].samples[0].1, "811008");
    assert_eq!(ours["scrape_error"].samples, vec![(BTreeMap::new(), "0".to_owned(), None)]);
    assert!(text.contains("# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE scrape_error gauge\nscrape_error 0\n"));
}

#[test]
fn resource_metrics_without_a_summary_report_a_scrape_error() {
    let text = resource_metrics::render(None);
    assert_eq!(
        text,
        "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE scrape_error gauge\nscrape_error 1\n"
    );
}

#[test]
fn resource_metrics_escape_label_values() {
    let mut s = Summary::default();
    s.pods.push(summary::PodStats {
        pod_ref: summary::PodReference {
            name: "a\"b\\c".to_owned(),
            namespace: "n\nx".to_owned(),
            uid: "u".to_owned(),
        },
        memory: Some(summary::MemoryStats { working_set_bytes: Some(1), ..Default::default() }),
        ..Default::default()
    });
    let text = resource_metrics::render(Some(&s));
    assert!(text.contains("pod_memory_working_set_bytes{namespace=\"n\\nx\",pod=\"a\\\"b\\\\c\"} 1\n"), "{text}");
}

/// `promtool check metrics` on `text`. promtool comes with the prometheus package the
/// test command installs; without it this fails rather than skipping.
fn promtool_check(text: &str) -> std::process::Output {
    use std::io::Write as _;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `cargo xtask test` installs it)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn promtool_accepts_the_resource_metrics() {
    let text = rendered_after_two_passes();
    let out = promtool_check(&text);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check metrics failed:\n{stdout}{stderr}\n{text}");
}

/// Read-only: the node-level numbers of the machine running the tests (a kubelet host
/// always has a cgroup filesystem).
#[test]
fn reads_the_real_host() {
    let hierarchies = CgroupHierarchies::detect(Path::new("/sys/fs/cgroup")).expect("a cgroup filesystem");
    let mut config = CollectorConfig::new(hierarchies);
    config.rate_min_window = Duration::ZERO;
    let mut collector = Collector::new(config);
    let inventory =
        Inventory { node_name: "host".to_owned(), root_fs_path: PathBuf::from("/"), ..Inventory::default() };
    collector.collect(&inventory);
    std::thread::sleep(Duration::from_millis(50));
    let c = collector.collect(&inventory);
    // cAdvisor's partitions of this machine include the root filesystem's source.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = mounts::parse_mountinfo(&mountinfo).into_iter().find(|m| m.mount_point == Path::new("/")).unwrap();
    let root_fs = c.node.filesystems.iter().find(|f| f.device == root.source).expect("a row for /");
    assert!(root_fs.info.capacity > 0 && root_fs.info.inodes > 0);
    let s = c.summary();
    let cpu = s.node.cpu.as_ref().unwrap();
    assert!(cpu.usage_core_nano_seconds.unwrap() > 0);
    assert!(cpu.usage_nano_cores.is_some());
    let mem = s.node.memory.as_ref().unwrap();
    assert!(mem.working_set_bytes.unwrap() > 0 && mem.working_set_bytes <= mem.usage_bytes);
    assert!(mem.available_bytes.is_some());
    assert!(s.node.fs.as_ref().unwrap().capacity_bytes.unwrap() > 0);
    assert!(s.node.rlimit.as_ref().unwrap().max_pid.unwrap() > 0);
    assert!(!s.node.start_time.is_zero());
    assert!(s.node.network.is_some());
}

fn cadvisor_machine() -> cadvisor::MachineInfo {
    cadvisor::MachineInfo {
        boot_id: "b00t".to_owned(),
        machine_id: "m4ch1ne".to_owned(),
        system_uuid: String::new(),
        cpu_cores: Some(4),
        cpu_physical_cores: Some(2),
        cpu_sockets: Some(1),
        kernel_version: "6.1.0".to_owned(),
        os_version: "Debian GNU/Linux 12 (bookworm)".to_owned(),
    }
}

fn cadvisor_after_two_passes() -> (Collection, String) {
    let (_, c, text) = cadvisor_fixture_after_two_passes();
    (c, text)
}

fn cadvisor_fixture_after_two_passes() -> (Fixture, Collection, String) {
    let mut f = v1_fixture();
    f.collect();
    f.advance(Duration::from_secs(10));
    let c = f.collect();
    let text = cadvisor::render_with(&c, &cadvisor_machine());
    (f, c, text)
}

/// The 1.28 inventory: family -> (TYPE, label names, HELP).
fn cadvisor_reference() -> BTreeMap<String, (String, BTreeSet<String>, String)> {
    let mut reference = BTreeMap::new();
    for line in CADVISOR_INVENTORY.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let labels = if cols[2] == "-" { BTreeSet::new() } else { cols[2].split(',').map(str::to_owned).collect() };
        reference.insert(cols[0].to_owned(), (cols[1].to_owned(), labels, cols[4].to_owned()));
    }
    reference
}

#[test]
fn cadvisor_families_match_the_kubelet_inventory() {
    let reference = cadvisor_reference();
    let (_, text) = cadvisor_after_two_passes();
    let ours = parse_text(&text);
    for family in &cadvisor::FAMILIES {
        let (kind, labels, help) = reference.get(family.name).unwrap_or_else(|| panic!("{} not upstream", family.name));
        assert_eq!(family.kind, kind, "TYPE of {}", family.name);
        assert_eq!(family.help, help, "HELP of {}", family.name);
        let declared: BTreeSet<String> = family.labels.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(&declared, labels, "labels of {}", family.name);
        let f = ours.get(family.name).unwrap_or_else(|| panic!("{} not announced:\n{text}", family.name));
        assert_eq!(&f.kind, kind);
        assert_eq!(&f.help, help);
        for (l, _, _) in &f.samples {
            assert_eq!(&l.keys().cloned().collect::<BTreeSet<_>>(), labels, "labels of {}", family.name);
        }
        // What the reference capture has rows of, the fixture renders rows of.
        let captured = CADVISOR_INVENTORY
            .lines()
            .find_map(|l| l.strip_prefix(family.name)?.strip_prefix('\t')?.split('\t').nth(2)?.parse::<usize>().ok());
        if captured.is_some_and(|n| n > 0) {
            assert!(!f.samples.is_empty(), "{} has rows upstream but none here:\n{text}", family.name);
        }
    }
    // Every announced family is in the table.
    assert_eq!(ours.len(), cadvisor::FAMILIES.len());
    // Every family with a `device` label upstream is rendered.
    for (name, (_, labels, _)) in &reference {
        if labels.contains("device") {
            assert!(cadvisor::FAMILIES.iter().any(|f| f.name == name), "{name} is not rendered");
        }
    }
}

#[test]
fn cadvisor_rendered_and_left_out_families_cover_the_inventory() {
    let reference: BTreeSet<String> = cadvisor_reference().into_keys().collect();
    let rendered: BTreeSet<String> = cadvisor::FAMILIES.iter().map(|f| f.name.to_owned()).collect();
    let left_out: BTreeSet<String> = cadvisor::NOT_RENDERED.iter().map(|(n, _)| (*n).to_owned()).collect();
    assert!(rendered.is_disjoint(&left_out), "{:?}", rendered.intersection(&left_out).collect::<Vec<_>>());
    assert_eq!(left_out.len(), cadvisor::NOT_RENDERED.len(), "duplicates in NOT_RENDERED");
    assert!(cadvisor::NOT_RENDERED.iter().all(|(_, why)| !why.is_empty()));
    let union: BTreeSet<String> = rendered.union(&left_out).cloned().collect();
    assert_eq!(union, reference);
}

#[test]
fn cadvisor_values_labels_and_timestamps() {
    let (c, text) = cadvisor_after_two_passes();
    let ours = parse_text(&text);
    let order: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap()).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(order, sorted);

    let pod = &c.pods[0];
    let app = pod.containers.iter().find(|c| c.name == "app").unwrap();
    let find = |family: &str, container: &str, id: &str| {
        ours[family]
            .samples
            .iter()
            .find(|s| s.0["container"] == container && s.0["id"] == id)
            .unwrap_or_else(|| panic!("{family} {container} {id}:\n{text}"))
            .clone()
    };
    let ts = (T0 + 10) as i64 * 1000 + 123;

    let ws = find("container_memory_working_set_bytes", "app", &app.cgroup);
    assert_eq!(ws.1, "495616");
    assert_eq!(ws.2, Some(ts));
    assert_eq!(ws.0["pod"], "web");
    assert_eq!(ws.0["namespace"], "nodebench");
    assert_eq!(ws.0["name"], app.id);
    assert_eq!(ws.0["image"], app.image);

    let cpu = find("container_cpu_usage_seconds_total", "app", &app.cgroup);
    assert_eq!(cpu.0["cpu"], "total");
    assert_eq!(cpu.1, "0.01328234");
    assert_eq!(cpu.2, Some(ts));

    // The pod cgroup row: pod and namespace, no container, image or name.
    let pod_ws = find("container_memory_working_set_bytes", "", POD_CG);
    assert_eq!(pod_ws.1, "811008");
    assert_eq!((pod_ws.0["pod"].as_str(), pod_ws.0["name"].as_str(), pod_ws.0["image"].as_str()), ("web", "", ""));
    // Network on the pod row, per interface.
    let rx: Vec<(String, String)> = ours["container_network_receive_bytes_total"]
        .samples
        .iter()
        .filter(|s| s.0["id"] == POD_CG)
        .map(|s| (s.0["interface"].clone(), s.1.clone()))
        .collect();
    assert!(rx.contains(&("eth0".to_owned(), "1296".to_owned())), "{rx:?}");

    // The root row.
    let root = find("container_cpu_usage_seconds_total", "", "/");
    assert_eq!(root.1, "5028.767409292");
    assert_eq!(root.0["pod"], "");

    // Spec and start time: no timestamp.
    let start = find("container_start_time_seconds", "app", &app.cgroup);
    assert_eq!(start.1, "1.7960596195e+09");
    assert_eq!(start.2, None);

    // Machine families.
    let cores = &ours["machine_cpu_cores"].samples;
    assert_eq!(cores.len(), 1);
    assert_eq!(cores[0].0["boot_id"], "b00t");
    assert_eq!(cores[0].0["system_uuid"], "");
    assert_eq!(cores[0].1, "4");
    assert_eq!(ours["machine_memory_bytes"].samples[0].1, "2.5769803776e+10");
    assert!(text.contains("\ncontainer_scrape_error 0\n"));
    assert!(text.contains("\nmachine_scrape_error 0\n"));
    assert!(text.contains("cadvisor_version_info{cadvisorRevision=\"\",cadvisorVersion=\"\",dockerVersion=\"\",kernelVersion=\"6.1.0\",osVersion=\"Debian GNU/Linux 12 (bookworm)\"} 1\n"));
}

#[test]
fn cadvisor_families_are_announced_without_samples() {
    let (mut c, _) = cadvisor_after_two_passes();
    c.pods.clear();
    c.node.network = None;
    let text = cadvisor::render_with(&c, &cadvisor::MachineInfo::default());
    assert!(text.contains("# HELP container_network_receive_bytes_total Cumulative count of bytes received\n# TYPE container_network_receive_bytes_total counter\n# HELP"));
    // Unreadable machine facts: empty label values, no core count.
    assert!(text.contains("machine_memory_bytes{boot_id=\"\",machine_id=\"\",system_uuid=\"\"} "), "{text}");
    assert!(!text.contains("\nmachine_cpu_cores{"));
}

#[test]
fn cadvisor_cpuinfo_counts() {
    let text = "processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t: 0\n\nprocessor\t: 2\nphysical id\t: 1\ncore id\t: 0\n";
    assert_eq!(cadvisor::parse_cpuinfo(text), (Some(3), Some(2), Some(2)));
    assert_eq!(cadvisor::parse_cpuinfo(""), (None, None, None));
}

#[test]
fn promtool_accepts_the_cadvisor_metrics() {
    let (_, text) = cadvisor_after_two_passes();
    let out = promtool_check(&text);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // promtool 2.x has no switch for its naming lints; the upstream names trip three of
    // them (camelCase labels of cadvisor_version_info, a counter without `_total`, a gauge
    // with it). Anything else (a parse error, another lint) fails.
    let known = [
        "cadvisor_version_info label names should be written in 'snake_case' not 'camelCase'",
        "container_memory_failcnt counter metrics should have \"_total\" suffix",
        "container_fs_inodes_total non-counter metrics should not have \"_total\" suffix",
    ];
    let unexpected: Vec<&str> =
        stdout.lines().chain(stderr.lines()).filter(|l| !l.trim().is_empty() && !known.contains(l)).collect();
    assert!(unexpected.is_empty(), "promtool check metrics failed:\n{stdout}{stderr}\n{text}");
}

// ---------------------------------------------------------------------------------------
// The spec files, cAdvisor's process stats and the families built on them.

/// Reads `cgroup` of the hierarchies under `cg` with the spec files.
fn read_spec(cg: &Path, cgroup: &str) -> Option<super::cgroup::CgroupSpec> {
    let mut reader = super::cgroup::CgroupReader::new(CgroupHierarchies::detect(cg).unwrap());
    let opts = super::cgroup::ReadOptions { spec: true, ..Default::default() };
    reader.read(cgroup, at(T0, 0), opts).unwrap().spec
}

#[test]
fn v1_spec_files_are_read_as_cadvisor_reads_them() {
    use super::cgroup::{CgroupSpec, CpuSpec};
    let dir = tempfile::tempdir().unwrap();
    let cg = dir.path();
    for h in ["cpuacct", "cpu", "memory", "pids"] {
        std::fs::create_dir_all(cg.join(h)).unwrap();
    }
    // Every file, unlimited soft limit and pids.
    write(cg, "cpuacct/a/cpuacct.usage", "1\n");
    write(cg, "cpu/a/cpu.shares", "512\n");
    write(cg, "cpu/a/cpu.cfs_period_us", "100000\n");
    write(cg, "memory/a/memory.soft_limit_in_bytes", V1_UNLIMITED);
    write(cg, "pids/a/pids.max", "max\n");
    assert_eq!(
        read_spec(cg, "/a"),
        Some(CgroupSpec {
            cpu: Some(CpuSpec { period: 100_000, shares: 512 }),
            memory_reservation: None,
            threads_max: Some(0),
        })
    );
    // A cpu directory without the files (cAdvisor: HasCpu, zeros), limited values.
    write(cg, "cpuacct/b/cpuacct.usage", "1\n");
    std::fs::create_dir_all(cg.join("cpu/b")).unwrap();
    write(cg, "memory/b/memory.soft_limit_in_bytes", "1048576\n");
    write(cg, "pids/b/pids.max", "64\n");
    assert_eq!(
        read_spec(cg, "/b"),
        Some(CgroupSpec {
            cpu: Some(CpuSpec { period: 0, shares: 0 }),
            memory_reservation: Some(1_048_576),
            threads_max: Some(64),
        })
    );
    // Nothing but usage: no cpu spec, nothing else either; unparsable numbers read 0.
    write(cg, "cpuacct/c/cpuacct.usage", "1\n");
    assert_eq!(read_spec(cg, "/c"), Some(CgroupSpec::default()));
    write(cg, "cpu/c/cpu.shares", "lots\n");
    assert_eq!(read_spec(cg, "/c").unwrap().cpu, Some(CpuSpec { period: 0, shares: 0 }));
    // Not asked for: not read.
    let mut reader = super::cgroup::CgroupReader::new(CgroupHierarchies::detect(cg).unwrap());
    assert_eq!(reader.read("/a", at(T0, 0), super::cgroup::ReadOptions::default()).unwrap().spec, None);
}

#[test]
fn v2_spec_files_are_read_as_cadvisor_reads_them() {
    use super::cgroup::{CgroupSpec, CpuSpec};
    let dir = tempfile::tempdir().unwrap();
    let cg = dir.path();
    write(cg, "cgroup.controllers", "cpu memory pids\n");
    // The root has none of the files: HasCpu with zeros, nothing else.
    assert_eq!(read_spec(cg, "/"), Some(CgroupSpec { cpu: Some(CpuSpec::default()), ..CgroupSpec::default() }));
    write(cg, "a/cpu.weight", "100\n");
    write(cg, "a/cpu.max", "max 100000\n");
    write(cg, "a/memory.min", "max\n");
    write(cg, "a/pids.max", "max\n");
    assert_eq!(
        read_spec(cg, "/a"),
        Some(CgroupSpec {
            cpu: Some(CpuSpec { period: 100_000, shares: 2597 }),
            memory_reservation: None,
            threads_max: Some(0),
        })
    );
    // A weight out of range is 0; a cpu.max without a period reads period 0.
    write(cg, "b/cpu.weight", "10001\n");
    write(cg, "b/cpu.max", "max\n");
    write(cg, "b/memory.min", "268435456\n");
    write(cg, "b/pids.max", "512\n");
    assert_eq!(
        read_spec(cg, "/b"),
        Some(CgroupSpec {
            cpu: Some(CpuSpec { period: 0, shares: 0 }),
            memory_reservation: Some(268_435_456),
            threads_max: Some(512),
        })
    );
    // A quota and its period, no weight file.
    write(cg, "c/cpu.max", "20000 50000\n");
    assert_eq!(read_spec(cg, "/c").unwrap().cpu, Some(CpuSpec { period: 50_000, shares: 0 }));
}

#[test]
fn cpu_weight_converts_back_to_shares_with_cadvisors_formula() {
    use super::cgroup::weight_to_shares;
    // cAdvisor's convertCPUWeightToCPULimit: 2 + (weight - 1) * 262142 / 9999 (integer
    // division) for weights 1..=10000, an error (no shares: 0) otherwise.
    let cases = [
        (0, 0),
        (1, 2),
        (2, 28),
        (12, 290),
        (39, 998),
        (100, 2597),
        (5000, 131_059),
        (9999, 262_117),
        (10_000, 262_144),
        (10_001, 0),
        (u64::MAX, 0),
    ];
    for (weight, shares) in cases {
        assert_eq!(weight_to_shares(weight), shares, "weight {weight}");
    }
    // With runc's linear shares -> weight (1 + (shares - 2) * 9999 / 262142) the kubelet's
    // 1024 shares of a 1-CPU request are weight 39 and read back as 998, not 1024.
    let runc = |shares: u64| 1 + ((shares - 2) * 9999) / 262_142;
    assert_eq!((runc(1024), weight_to_shares(runc(1024))), (39, 998));
    assert_eq!(weight_to_shares(runc(2)), 2);
    assert_eq!(weight_to_shares(runc(262_144)), 262_144);
}

#[test]
fn the_fds_and_sockets_of_a_real_process_are_counted() {
    use super::processes::{FdCounter, FdCounts};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixDatagram;
    // A child whose descriptors 0, 1 and 2 are a file, a socket and /dev/null, besides
    // what this process inherited without close-on-exec (a test runner's, say). It sleeps:
    // its descriptors stay as they are while they are counted.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "input", "x");
    let file = std::fs::File::open(dir.path().join("input")).unwrap();
    let (socket, _peer) = UnixDatagram::pair().unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .stdin(file)
        .stdout(OwnedFd::from(socket))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Spawning returns once the child's exec has begun, before the kernel closes the
    // close-on-exec descriptors it was forked with: wait until it sleeps in `sleep`.
    let stat = PathBuf::from(format!("/proc/{}/stat", child.id()));
    let sleeping = || std::fs::read_to_string(&stat).is_ok_and(|s| s.contains("(sleep) S "));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sleeping() {
        assert!(std::time::Instant::now() < deadline, "the child never slept");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut counter = FdCounter::new(Path::new("/proc"));
    let counts = counter.count_process(child.id());
    // A process that is gone (no pid reaches 4e9) is skipped silently.
    let total = counter.count(&[child.id(), 4_000_000_000]);
    // The same by hand: every entry of the fd directory, and those linking to a socket.
    let fd_dir = PathBuf::from(format!("/proc/{}/fd", child.id()));
    let links: Vec<String> = std::fs::read_dir(&fd_dir)
        .unwrap()
        .map(|e| std::fs::read_link(e.unwrap().path()).unwrap().to_string_lossy().into_owned())
        .collect();
    let stdout = std::fs::read_link(fd_dir.join("1")).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let by_hand =
        FdCounts { fds: links.len() as u64, sockets: links.iter().filter(|l| l.starts_with("socket:")).count() as u64 };
    assert_eq!(counts, Some(by_hand), "{links:?}");
    assert_eq!(total, by_hand);
    assert!(by_hand.fds >= 3 && by_hand.sockets >= 1, "{links:?}");
    assert!(stdout.to_string_lossy().starts_with("socket:["), "{}", stdout.display());
    assert_eq!(counter.count_process(child.id()), None, "reaped: no fd directory");
}

#[test]
fn the_fds_and_sockets_of_this_process_go_up() {
    use super::processes::FdCounter;
    use std::os::unix::net::UnixDatagram;
    let mut counter = FdCounter::new(Path::new("/proc"));
    let before = counter.count_process(std::process::id()).unwrap();
    // More than one getdents64 buffer's worth of entries, to walk several batches.
    let files: Vec<std::fs::File> = (0..1500).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
    let sockets: Vec<UnixDatagram> = (0..64).map(|_| UnixDatagram::unbound().unwrap()).collect();
    let after = counter.count_process(std::process::id()).unwrap();
    // Other tests open and close descriptors meanwhile: what this test holds is a floor,
    // and no other test closes dozens of sockets at once.
    assert!(after.fds >= (files.len() + sockets.len()) as u64, "{after:?}");
    assert!(after.sockets >= sockets.len() as u64, "{after:?}");
    assert!(after.sockets >= before.sockets + 32, "{before:?} -> {after:?}");
    assert!(after.fds > before.fds, "{before:?} -> {after:?}");
}

#[test]
fn max_open_files_is_the_soft_limit_of_proc_limits() {
    use super::processes::parse_max_open_files;
    let text = std::fs::read_to_string("/proc/self/limits").unwrap();
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) fills the struct it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) }, 0);
    let soft = if limit.rlim_cur == libc::RLIM_INFINITY { -1 } else { limit.rlim_cur as i64 };
    assert_eq!(parse_max_open_files(&text), Some(soft), "{text}");

    assert_eq!(parse_max_open_files(&limits("unlimited", "unlimited")), Some(-1));
    assert_eq!(parse_max_open_files(&limits("1024", "unlimited")), Some(1024));
    assert_eq!(parse_max_open_files(&limits("1024", "many")), None, "an unparsable hard limit drops the line");
    assert_eq!(parse_max_open_files(&limits("some", "1024")), None);
    assert_eq!(
        parse_max_open_files("Max cpu time              unlimited            unlimited            seconds\n"),
        None
    );
}

/// The value and timestamp of `family` on the row of `id` (with `extra` labels), if any.
fn sample_of(
    ours: &BTreeMap<String, Parsed>,
    family: &str,
    id: &str,
    extra: &[(&str, &str)],
) -> Option<(String, Option<i64>)> {
    ours[family]
        .samples
        .iter()
        .find(|s| s.0["id"] == id && extra.iter().all(|(k, v)| s.0.get(*k).is_some_and(|x| x == v)))
        .map(|s| (s.1.clone(), s.2))
}

#[test]
fn cadvisor_spec_process_and_task_families_on_v1() {
    let (_, c, text) = cadvisor_fixture_after_two_passes();
    let ours = parse_text(&text);
    let ts = Some((T0 + 10) as i64 * 1000 + 123);
    let app = format!("{POD_CG}/c1");
    let sidecar = format!("{POD_CG}/c2");
    let get = |family: &str, id: &str| sample_of(&ours, family, id, &[]);

    // Spec families: no timestamp.
    assert_eq!(get("container_spec_cpu_period", &app), Some(("50000".into(), None)));
    assert_eq!(get("container_spec_cpu_shares", &app), Some(("102".into(), None)));
    assert_eq!(get("container_spec_memory_reservation_limit_bytes", &app), Some(("6.7108864e+07".into(), None)));
    assert_eq!(get("container_spec_cpu_shares", POD_CG), Some(("307".into(), None)));
    assert_eq!(get("container_spec_memory_reservation_limit_bytes", POD_CG), Some(("0".into(), None)), "unlimited");
    assert_eq!(get("container_spec_cpu_shares", "/"), Some(("1024".into(), None)));
    assert_eq!(get("container_spec_cpu_period", "/"), Some(("100000".into(), None)));
    assert_eq!(get("container_spec_cpu_period", &sidecar), None, "no cpu directory: no cpu spec");

    // Stats families: the stats' timestamp.
    assert_eq!(get("container_threads_max", &app), Some(("1024".into(), ts)));
    assert_eq!(get("container_threads_max", POD_CG), Some(("0".into(), ts)), "max");
    assert_eq!(get("container_threads_max", &sidecar), Some(("0".into(), ts)), "no pids.max");
    // app: 4242's five descriptors, two of them sockets; 4243 is gone.
    assert_eq!(get("container_file_descriptors", &app), Some(("5".into(), ts)));
    assert_eq!(get("container_sockets", &app), Some(("2".into(), ts)));
    let ulimit = |id: &str| sample_of(&ours, "container_ulimits_soft", id, &[("ulimit", "max_open_files")]);
    assert_eq!(ulimit(&app), Some(("1.048576e+06".into(), ts)));
    // The pod cgroup has no process of its own and no root process.
    assert_eq!(get("container_file_descriptors", POD_CG), Some(("0".into(), ts)));
    assert_eq!(get("container_sockets", POD_CG), Some(("0".into(), ts)));
    assert_eq!(ulimit(POD_CG), None);
    // The root: its own processes (pid 1; pid 2 has no fd directory) and pid 1's limit.
    let root_ts = Some(T0 as i64 * 1000 + 10_123);
    assert_eq!(get("container_file_descriptors", "/"), Some(("3".into(), root_ts)));
    assert_eq!(get("container_sockets", "/"), Some(("1".into(), root_ts)));
    assert_eq!(ulimit("/"), Some(("-1".into(), root_ts)), "unlimited");
    // sidecar's processes are not in the cpu hierarchy of the fixture: no process stats.
    assert_eq!(get("container_file_descriptors", &sidecar), None);
    assert_eq!(ulimit(&sidecar), None);
    assert_eq!(ours["container_ulimits_soft"].samples.len(), 2);

    // Load and task states: zeros on every row, as the kubelet's cAdvisor serves them.
    let rows = 1 + c.pods.iter().map(|p| 1 + p.containers.len()).sum::<usize>();
    assert_eq!(ours["container_cpu_load_average_10s"].samples.len(), rows);
    assert_eq!(ours["container_tasks_state"].samples.len(), 5 * rows);
    assert!(ours["container_tasks_state"].samples.iter().all(|s| s.1 == "0" && s.2.is_some()));
    for state in cadvisor::TASK_STATES {
        assert_eq!(sample_of(&ours, "container_tasks_state", &app, &[("state", state)]), Some(("0".into(), ts)));
    }
    assert_eq!(get("container_cpu_load_average_10s", &app), Some(("0".into(), ts)));

    // System containers are not rows of the endpoint: no spec files read, no walk.
    let pods = &c.system_containers[0].stats;
    assert_eq!((pods.spec, pods.process_stats), (None, None));
}

#[test]
fn cadvisor_spec_and_process_families_on_v2() {
    let mut f = v2_fixture();
    let c = f.collect();
    let ours = parse_text(&cadvisor::render_with(&c, &cadvisor_machine()));
    let app = format!("{POD_CG}/c1");
    let value = |family: &str, id: &str| sample_of(&ours, family, id, &[]).map(|(v, _)| v);
    assert_eq!(value("container_spec_cpu_shares", &app).as_deref(), Some("998"), "weight 39");
    assert_eq!(value("container_spec_cpu_period", &app).as_deref(), Some("100000"));
    assert_eq!(value("container_spec_memory_reservation_limit_bytes", &app).as_deref(), Some("3.3554432e+07"));
    assert_eq!(value("container_threads_max", &app).as_deref(), Some("1024"));
    assert_eq!(value("container_file_descriptors", &app).as_deref(), Some("5"));
    assert_eq!(value("container_sockets", &app).as_deref(), Some("2"));
    assert_eq!(value("container_spec_cpu_shares", POD_CG).as_deref(), Some("290"), "weight 12");
    assert_eq!(value("container_spec_cpu_period", POD_CG).as_deref(), Some("100000"));
    assert_eq!(value("container_threads_max", POD_CG).as_deref(), Some("0"));
    // The root has none of the spec files: zeros, as cAdvisor reads them there.
    assert_eq!(value("container_spec_cpu_shares", "/").as_deref(), Some("0"));
    assert_eq!(value("container_spec_cpu_period", "/").as_deref(), Some("0"));
    assert_eq!(value("container_threads_max", "/").as_deref(), Some("0"));
    assert_eq!(value("container_file_descriptors", "/").as_deref(), Some("3"));
    let ulimit = sample_of(&ours, "container_ulimits_soft", "/", &[("ulimit", "max_open_files")]);
    assert_eq!(ulimit.map(|(v, _)| v).as_deref(), Some("-1"));
}

// ---------------------------------------------------------------------------------------
// Filesystem stats: the walker, the background `du` cache, mount tables, the Summary's
// filesystem fields and the `container_fs_*` families.

/// A small tree: `dir/{a (3000 B), link (hard link to a), sym -> /usr, sub/{b (10 B)}}`.
fn walk_tree() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("tree");
    write(&top, "a", &"a".repeat(3000));
    write(&top, "sub/b", "0123456789");
    std::fs::hard_link(top.join("a"), top.join("link")).unwrap();
    std::os::unix::fs::symlink("/usr", top.join("sym")).unwrap();
    (dir, top)
}

fn lstat_bytes(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().blocks() * 512
}

#[test]
fn walker_counts_blocks_and_inodes_like_du() {
    let (_dir, top) = walk_tree();
    let w = fs::walk(&top).unwrap();
    let want = lstat_bytes(&top)
        + lstat_bytes(&top.join("a"))
        + lstat_bytes(&top.join("sym"))
        + lstat_bytes(&top.join("sub"))
        + lstat_bytes(&top.join("sub/b"));
    // tree, a (once for both links), sym (not followed), sub, sub/b.
    assert_eq!(w.usage, fs::DiskUsage { bytes: want, inodes: 5 });
    assert_eq!(w.unreadable, 0);
    // A file alone, and a path that does not exist.
    assert_eq!(fs::disk_usage(&top.join("sub/b")).unwrap().inodes, 1);
    assert!(fs::walk(&top.join("missing")).is_err());
}

#[test]
fn walker_skips_what_vanishes_and_counts_what_it_cannot_list() {
    // Two subdirectories; when the first is about to be listed, the other vanishes.
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("t");
    write(&top, "d1/f", "x");
    write(&top, "d2/g", "y");
    let mut first: Option<PathBuf> = None;
    let w = fs::walk_with(&top, &mut |d| {
        if d != top && first.is_none() {
            first = Some(d.to_path_buf());
            let other = if d.ends_with("d1") { top.join("d2") } else { top.join("d1") };
            std::fs::remove_dir_all(other).unwrap();
        }
    })
    .unwrap();
    // t, d1, d2 (seen before it vanished), and the file of the one listed.
    assert_eq!((w.usage.inodes, w.unreadable), (4, 0));

    // A directory replaced by a file between being seen and being listed.
    write(&top, "d3/h", "z");
    let w = fs::walk_with(&top, &mut |d| {
        if d.ends_with("d3") {
            std::fs::remove_dir_all(d).unwrap();
            std::fs::write(d, "now a file").unwrap();
        }
    })
    .unwrap();
    assert_eq!(w.unreadable, 1, "{w:?}");
}

#[tokio::test(start_paused = true)]
async fn fs_usage_cache_walks_in_the_background_with_jittered_cadence() {
    let (_dir, top) = walk_tree();
    let config = FsUsageConfig { interval: Duration::from_mins(1), jitter: 0.5, idle: Duration::from_mins(5) };
    let cache = Arc::new(FsUsageCache::new(config, Arc::new(SystemTime::now)));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&cache).run(shutdown.clone()));

    // Asking registers the path and never walks; the background task walks it at once.
    assert!(cache.get(&top).is_none());
    assert_eq!(cache.walks(), 0);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(cache.walks(), 1);
    let first = cache.get(&top).unwrap();
    assert_eq!(first.usage.unwrap().inodes, 5);

    // Not again before the interval; again within interval × (1 + jitter).
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(cache.walks(), 1);
    std::fs::write(top.join("new"), "n").unwrap();
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(cache.walks(), 2);
    assert_eq!(cache.get(&top).unwrap().usage.unwrap().inodes, 6);

    // Scraped every 10 s for 10 minutes: one walk per 60..90 s.
    let before = cache.walks();
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(cache.get(&top).is_some());
    }
    let walks = cache.walks() - before;
    assert!((6..=11).contains(&walks), "{walks} walks in 10 minutes");

    // Nobody asks: the walks stop after `idle`.
    tokio::time::sleep(Duration::from_mins(7)).await;
    let idle = cache.walks();
    tokio::time::sleep(Duration::from_hours(1)).await;
    assert_eq!(cache.walks(), idle, "an unwanted path is not walked");
    // Asked again: stale value at once, a fresh walk right after.
    assert!(cache.get(&top).is_some());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(cache.walks(), idle + 1);

    // A path that cannot be examined: no usage, no panic, still retried.
    let missing = top.join("missing");
    assert!(cache.get(&missing).is_none());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(cache.get(&missing).is_none());
    assert_eq!(cache.len(), 2);
    cache.retain(&std::collections::HashSet::from([top.clone()]));
    assert_eq!(cache.len(), 1);

    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn fs_usage_cache_walks_what_is_older_than_asked_on_demand() {
    let (_dir, top) = walk_tree();
    let config = FsUsageConfig { interval: Duration::from_mins(1), jitter: 0.0, idle: Duration::from_mins(5) };
    let (clock, clock_now) = test_clock(UNIX_EPOCH + Duration::from_secs(1000));
    let cache = FsUsageCache::new(config, clock);
    let other = top.join("sub");
    assert!(cache.get(&top).is_none() && cache.get(&other).is_none());
    // Never measured: walked.
    assert_eq!(cache.refresh_older_than(Duration::from_secs(5)), 2);
    assert_eq!(cache.get(&top).unwrap().usage.unwrap().inodes, 5);
    // Measured just now: not again.
    assert_eq!(cache.refresh_older_than(Duration::from_secs(5)), 0);
    // Older than asked: walked again and sees what was written since.
    std::fs::write(top.join("new"), "n").unwrap();
    *clock_now.lock().unwrap() += Duration::from_secs(6);
    assert_eq!(cache.refresh_older_than(Duration::from_secs(5)), 2);
    assert_eq!(cache.get(&top).unwrap().usage.unwrap().inodes, 6);
    // Paths nobody wants any more are not walked.
    tokio::time::sleep(Duration::from_mins(6)).await;
    *clock_now.lock().unwrap() += Duration::from_mins(6);
    assert_eq!(cache.refresh_older_than(Duration::from_secs(5)), 0);
}

#[test]
fn mountinfo_escapes_and_root_overlay_upper_dir() {
    let text = "700 600 0:90 / / rw,relatime master:3 - overlay overlay rw,lowerdir=/s/1/fs:/s/2/fs,upperdir=/var/lib/containerd/snap\\0542/fs,workdir=/w
701 700 0:91 / /my\\040dir rw - tmpfs tmp\\011fs rw
bogus line
";
    let m = mounts::parse_mountinfo(text);
    assert_eq!(m.len(), 2);
    assert_eq!((m[0].major, m[0].minor), (0, 90));
    assert_eq!(m[1].mount_point, PathBuf::from("/my dir"));
    assert_eq!(m[1].source, "tmp\tfs");
    assert_eq!(mounts::option(&m[0].super_options, "workdir").as_deref(), Some("/w"));
    // The escaped comma stays part of the path.
    assert_eq!(mounts::root_overlay_upperdir(text), Some(PathBuf::from("/var/lib/containerd/snap,2/fs")));
    // A root that is not an overlay, or a read-only overlay: no writable layer.
    assert_eq!(mounts::root_overlay_upperdir("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"), None);
    assert_eq!(mounts::root_overlay_upperdir("1 0 0:5 / / rw - overlay overlay ro,lowerdir=/a:/b\n"), None);
    assert_eq!(mounts::root_overlay_upperdir(""), None);
}

#[test]
fn partitions_follow_cadvisor() {
    let text = "1 0 254:0 / / rw - ext4 /dev/vda rw
2 1 254:0 /data /srv rw - ext4 /dev/vda rw
3 1 0:23 / /dev/shm rw - tmpfs tmpfs rw
4 1 0:24 / /run rw - tmpfs tmpfs rw
5 1 0:50 / /run/c/rootfs rw - overlay overlay rw,upperdir=/u
6 1 0:22 / /sys rw - sysfs sysfs rw
7 1 0:40 / /mnt/nfs rw - nfs4 server:/export rw
8 1 8:16 / /data rw - xfs /dev/sdb rw
";
    let p = mounts::partitions(&mounts::parse_mountinfo(text));
    let devices: Vec<(&str, &str)> = p.iter().map(|p| (p.device.as_str(), p.mount_point.to_str().unwrap())).collect();
    assert_eq!(
        devices,
        [
            ("/dev/sdb", "/data"),
            ("/dev/shm", "/dev/shm"),
            ("/dev/vda", "/"),
            ("/run", "/run"),
            ("overlay_0-50", "/run/c/rootfs"),
            ("server:/export", "/mnt/nfs"),
        ]
    );
    // The root's raw source is added whatever its type (cAdvisor's system root label).
    let p = mounts::partitions(&mounts::parse_mountinfo("1 0 0:31 / / rw - overlay overlay rw\n"));
    let devices: Vec<&str> = p.iter().map(|p| p.device.as_str()).collect();
    assert_eq!(devices, ["overlay", "overlay_0-31"]);
}

#[test]
fn diskstats_keep_cadvisors_devices() {
    let text = "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11 0 0 0 0
   8       1 sda1 1 0 0 0 0 0 0 0 0 0 0
 202       0 xvda 1 0 0 0 0 0 0 0 0 0 0
 253       0 dm-0 1 0 0 0 0 0 0 0 0 0 0
 259       0 nvme0n1 1 0 0 0 0 0 0 0 0 0 0
   7       0 loop0 1 0 0 0 0 0 0 0 0 0 0
  11       0 sr0 1 0 0 0 0 0 0 0 0 0 0
 254       0 vdb 1 0 0
";
    let d = mounts::parse_diskstats(text);
    let mut names: Vec<&str> = d.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["/dev/dm-0", "/dev/sda", "/dev/sda1", "/dev/xvda"]);
    let sda = d["/dev/sda"];
    assert_eq!(
        (sda.reads_completed, sda.read_time_ms, sda.writes_completed, sda.io_in_progress, sda.weighted_io_time_ms),
        (1, 4, 5, 9, 11)
    );
    // A partition found by number when its name is not a disk row.
    let p = mounts::Partition {
        device: "/dev/root".to_owned(),
        mount_point: PathBuf::from("/"),
        fs_type: "ext4".to_owned(),
        major: 8,
        minor: 1,
    };
    assert_eq!(mounts::disk_stats_of(&d, &p).map(|s| s.minor), Some(1));
}

#[test]
fn block_io_files() {
    let v1 = cgroup::parse_blkio_serviced("8:0 Read 7\n8:0 Write 3\n8:0 Total 10\n8:16 Read 1\nTotal 11\n");
    assert_eq!(
        v1.iter().map(|d| (d.major, d.minor, d.reads, d.writes)).collect::<Vec<_>>(),
        [(8, 0, 7, 3), (8, 16, 1, 0)]
    );
    assert!(cgroup::parse_blkio_serviced("Total 0\n").is_empty());
    let v2 = cgroup::parse_io_stat("8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n253:1 rbytes=0\n");
    assert_eq!(
        v2.iter().map(|d| (d.major, d.minor, d.reads, d.writes)).collect::<Vec<_>>(),
        [(8, 0, 3, 4), (253, 1, 0, 0)]
    );
}

#[test]
fn block_devices_are_named_like_cadvisor() {
    let dir = tempfile::tempdir().unwrap();
    write_mounts(dir.path());
    let disks = mounts::block_devices(&dir.path().join("sys/block"));
    let mut names: Vec<(&(u32, u32), &str)> = disks.iter().map(|(k, v)| (k, v.as_str())).collect();
    names.sort_unstable();
    assert_eq!(names, [(&(8, 16), "/dev/sdb"), (&(254, 0), "/dev/vda")]);
}

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object().unwrap_or_else(|| panic!("not an object: {v}")).keys().cloned().collect()
}

#[test]
fn filesystem_stats_have_the_reference_fields() {
    let reference: serde_json::Value = serde_json::from_str(SUMMARY_SAMPLE).unwrap();
    let mut f = v1_fixture();
    f.collect();
    f.refresh_fs();
    let c = f.collect();
    let ours = serde_json::to_value(c.summary()).unwrap();
    let node = &ours["node"];
    assert_eq!(keys(&node["fs"]), keys(&reference["node"]["fs"]));
    assert_eq!(keys(&node["runtime"]), keys(&reference["node"]["runtime"]), "imageFs only, as 1.28");
    assert_eq!(keys(&node["runtime"]["imageFs"]), keys(&reference["node"]["runtime"]["imageFs"]));
    assert_eq!(node["runtime"]["imageFs"]["usedBytes"], 2_125_824);
    assert_eq!(node["runtime"]["imageFs"]["time"], "2026-11-30T17:28:08Z", "the runtime's time");
    let rc = &reference["pods"][0]["containers"][0];
    let rp = &reference["pods"][0];
    let pod = &ours["pods"][0];
    let app = pod["containers"].as_array().unwrap().iter().find(|c| c["name"] == "app").unwrap();
    assert_eq!(keys(&app["rootfs"]), keys(&rc["rootfs"]));
    assert_eq!(keys(&app["logs"]), keys(&rc["logs"]));
    assert_eq!(keys(&pod["ephemeral-storage"]), keys(&rp["ephemeral-storage"]));
    for v in pod["volume"].as_array().unwrap() {
        assert_eq!(keys(v), keys(&rp["volume"][0]));
    }
    // The CPU-and-memory variant has none of them.
    let small = serde_json::to_value(c.cpu_and_memory_summary()).unwrap();
    assert!(small["node"].get("fs").is_none() && small["node"].get("runtime").is_none());
    assert!(small["pods"][0].get("ephemeral-storage").is_none() && small["pods"][0].get("volume").is_none());
    assert!(small["pods"][0]["containers"][0].get("rootfs").is_none());
}

#[test]
fn missing_mount_table_and_invisible_layers_leave_stats_out() {
    let mut f = v1_fixture();
    std::fs::remove_file(f.proc_root.join("self/mountinfo")).unwrap();
    // sidecar's upper dir is not visible from here (containerd in another namespace).
    write(
        &f.proc_root,
        "4250/mountinfo",
        "1 0 0:90 / / rw - overlay overlay rw,lowerdir=/a,upperdir=/nowhere/snapshots/9/fs,workdir=/w\n",
    );
    f.collect();
    f.refresh_fs();
    let c = f.collect();
    assert!(c.node.filesystems.is_empty());
    let s = c.summary();
    let rootfs = container(pod(&s, "web"), "sidecar").rootfs.clone().unwrap();
    assert!(rootfs.capacity_bytes.is_some() && rootfs.used_bytes.is_none());
    let text = cadvisor::render_with(&c, &cadvisor_machine());
    let ours = parse_text(&text);
    assert!(ours["container_fs_usage_bytes"].samples.is_empty());
    assert!(text.contains("# TYPE container_fs_usage_bytes gauge\n"), "announced without samples");
}

#[test]
fn cadvisor_filesystem_rows() {
    let reference = cadvisor_reference();
    let (f, c, text) = cadvisor_fixture_after_two_passes();
    let ours = parse_text(&text);
    let ts = (T0 + 10) as i64 * 1000 + 123;
    let shm = f.root.join("shm").display().to_string();
    let shm2 = f.root.join("shm2").display().to_string();
    let mut want = vec!["/dev/sdc", "/dev/vda", "overlay_0-50", shm.as_str(), shm2.as_str()];
    want.sort_unstable();

    let fs_families: Vec<&String> = reference.keys().filter(|k| k.starts_with("container_fs_")).collect();
    assert_eq!(fs_families.len(), 15);
    for name in &fs_families {
        let f = &ours[name.as_str()];
        assert!(!f.samples.is_empty(), "{name} has no rows");
        assert!(f.samples.iter().all(|s| s.2 == Some(ts)), "{name}: every row carries the stats' time");
        // The root's rows: one per partition that could be examined (not `gone`).
        let mut devices: Vec<&str> =
            f.samples.iter().filter(|s| s.0["id"] == "/").map(|s| s.0["device"].as_str()).collect();
        devices.sort_unstable();
        assert_eq!(devices, want, "{name}");
        // Usage-type families exist on the root only (containerd containers have none).
        if !matches!(name.as_str(), "container_fs_reads_total" | "container_fs_writes_total") {
            assert!(f.samples.iter().all(|s| s.0["id"] == "/"), "{name} has a non-root row");
        }
    }
    let value = |family: &str, id: &str, device: &str| {
        ours[family]
            .samples
            .iter()
            .find(|s| s.0["id"] == id && s.0["device"] == device)
            .unwrap_or_else(|| panic!("{family} {id} {device}:\n{text}"))
            .1
            .clone()
    };
    // /dev/vda: statvfs of "/", counters of its diskstats row; times are ms / 1e9.
    let vda = c.node.filesystems.iter().find(|f| f.device == "/dev/vda").unwrap();
    let go = |v: u64| {
        let mut g = String::new();
        write_go_float(&mut g, v as f64);
        g
    };
    let root = fs::statvfs(Path::new("/")).unwrap();
    assert_eq!((vda.info.capacity, vda.info.inodes), (root.capacity, root.inodes), "statvfs of the mount point");
    assert_eq!(value("container_fs_limit_bytes", "/", "/dev/vda"), go(vda.info.capacity));
    assert_eq!(value("container_fs_usage_bytes", "/", "/dev/vda"), go(vda.info.usage), "capacity - free");
    assert_eq!(value("container_fs_inodes_total", "/", "/dev/vda"), go(vda.info.inodes));
    assert_eq!(value("container_fs_inodes_free", "/", "/dev/vda"), go(vda.info.inodes_free));
    // The mount point with an escaped space was found.
    assert!(c.node.filesystems.iter().any(|f| f.device == "/dev/sdc"));
    for (family, want) in [
        ("container_fs_reads_total", "10"),
        ("container_fs_reads_merged_total", "1"),
        ("container_fs_sector_reads_total", "80"),
        ("container_fs_read_seconds_total", "5e-06"),
        ("container_fs_writes_total", "20"),
        ("container_fs_writes_merged_total", "2"),
        ("container_fs_sector_writes_total", "160"),
        ("container_fs_write_seconds_total", "7e-06"),
        ("container_fs_io_current", "0"),
        ("container_fs_io_time_seconds_total", "9e-06"),
        ("container_fs_io_time_weighted_seconds_total", "1.2e-05"),
    ] {
        assert_eq!(value(family, "/", "/dev/vda"), want, "{family}");
    }
    assert_eq!(value("container_fs_io_current", "/", "/dev/sdc"), "1");
    assert_eq!(value("container_fs_reads_total", "/", "overlay_0-50"), "0", "no disk row: zero");

    // Block I/O of the container and pod cgroups, by disk name ("" when unknown).
    let app = &c.pods[0].containers[0];
    assert_eq!(value("container_fs_reads_total", &app.cgroup, "/dev/vda"), "7");
    assert_eq!(value("container_fs_writes_total", &app.cgroup, "/dev/vda"), "3");
    assert_eq!(value("container_fs_reads_total", &app.cgroup, "/dev/sdb"), "1");
    assert_eq!(value("container_fs_reads_total", &app.cgroup, ""), "2");
    assert_eq!(value("container_fs_reads_total", POD_CG, "/dev/vda"), "8");
    let row = ours["container_fs_reads_total"].samples.iter().find(|s| s.0["id"] == app.cgroup).unwrap();
    assert_eq!((row.0["container"].as_str(), row.0["pod"].as_str(), row.0["name"].as_str()), ("app", "web", "c1"));
    // Containers without block I/O data have no rows.
    let sidecar = &c.pods[0].containers[1];
    assert!(!ours["container_fs_reads_total"].samples.iter().any(|s| s.0["id"] == sidecar.cgroup));
}

#[test]
fn cadvisor_block_io_on_cgroup_v2() {
    let mut f = v2_fixture();
    let c = f.collect();
    let app = &c.pods[0].containers[0];
    assert_eq!(app.stats.io.len(), 1);
    assert_eq!((app.stats.io[0].device.as_str(), app.stats.io[0].reads, app.stats.io[0].writes), ("/dev/vda", 4, 2));
    let ours = parse_text(&cadvisor::render_with(&c, &cadvisor_machine()));
    let row = ours["container_fs_writes_total"].samples.iter().find(|s| s.0["id"] == app.cgroup).unwrap();
    assert_eq!((row.0["device"].as_str(), row.1.as_str()), ("/dev/vda", "2"));
}

fn provider_for(
    f: &Fixture,
    runtime: Arc<crate::container::fake::FakeRuntime>,
    collector: Collector,
) -> provider::StatsProvider {
    let settings = provider::StatsSettings {
        node_name: "node-a".to_owned(),
        root_dir: f.root.clone(),
        pod_logs_dir: f.root.join("var/log/pods"),
        pods_cgroup: Some("/kubepods".to_owned()),
    };
    provider::StatsProvider::new(
        settings,
        collector,
        runtime,
        crate::pod_manager::PodManager::new(&[]),
        Arc::new(crate::cm::fake::FakePodContainerManager::default()),
        Arc::new(crate::volumes::VolumeManager::new(f.root.join("pods"), Arc::new(crate::volumes::NoApiServer))),
    )
}

#[tokio::test(start_paused = true)]
async fn image_fs_info_is_asked_once_per_ten_seconds() {
    use crate::container::api;
    let f = v1_fixture();
    let runtime = Arc::new(crate::container::fake::FakeRuntime::default());
    runtime.set_image_fs_info(api::ImageFsInfoResponse {
        image_filesystems: vec![api::FilesystemUsage {
            timestamp: (T0 as i64 - 1) * 1_000_000_000,
            fs_id: Some(api::FilesystemIdentifier { mountpoint: f.root.display().to_string() }),
            used_bytes: Some(api::UInt64Value { value: 2_125_824 }),
            inodes_used: Some(api::UInt64Value { value: 69 }),
        }],
        container_filesystems: Vec::new(),
    });
    let config = f.collector.config().clone();
    let p = provider_for(&f, Arc::clone(&runtime), Collector::new(config));
    let asked = || runtime.calls().iter().filter(|c| *c == "image_fs_info").count();

    let c = p.collection().await.unwrap();
    let image_fs = c.summary().node.runtime.unwrap().image_fs.unwrap();
    assert_eq!((image_fs.used_bytes, image_fs.inodes_used), (Some(2_125_824), Some(69)));
    assert_eq!(image_fs.capacity_bytes, Some(fs::statvfs(&f.root).unwrap().capacity));
    assert_eq!(image_fs.time, Time::from(at(T0 - 1, 0)));
    assert_eq!(asked(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    p.collection().await.unwrap();
    assert_eq!(asked(), 1, "reused");
    tokio::time::advance(Duration::from_secs(10)).await;
    p.collection().await.unwrap();
    assert_eq!(asked(), 2);

    // A runtime without ImageFsInfo: the summary still works, without runtime stats.
    let bare = Arc::new(crate::container::fake::FakeRuntime::default());
    bare.unimplement_image_fs_info();
    let p = provider_for(&f, bare, Collector::new(f.collector.config().clone()));
    let s = p.collection().await.unwrap().summary();
    assert!(s.node.runtime.is_none() && s.node.fs.is_some());
}

#[test]
fn image_fs_inventory_takes_the_first_image_filesystem() {
    use crate::container::api;
    let fs = |m: &str, ts: i64| api::FilesystemUsage {
        timestamp: ts,
        fs_id: Some(api::FilesystemIdentifier { mountpoint: m.to_owned() }),
        used_bytes: Some(api::UInt64Value { value: 1 }),
        inodes_used: None,
    };
    let r =
        api::ImageFsInfoResponse { image_filesystems: vec![fs("/a", 0), fs("/b", 5)], container_filesystems: vec![] };
    let i = provider::image_fs_inventory(&r).unwrap();
    assert_eq!((i.mountpoint, i.used_bytes, i.inodes_used, i.time), (PathBuf::from("/a"), Some(1), None, None));
    let r = api::ImageFsInfoResponse { image_filesystems: vec![fs("", 5)], container_filesystems: vec![] };
    assert!(provider::image_fs_inventory(&r).is_none());
    assert!(provider::image_fs_inventory(&api::ImageFsInfoResponse::default()).is_none());
}

#[tokio::test(start_paused = true)]
async fn housekeeping_collects_while_the_stats_are_read_and_scrapes_reuse_it() {
    let f = v1_fixture();
    let runtime = Arc::new(crate::container::fake::FakeRuntime::default());
    let p = Arc::new(
        provider_for(&f, Arc::clone(&runtime), Collector::new(f.collector.config().clone()))
            .with_housekeeping(provider::HOUSEKEEPING_INTERVAL),
    );
    let collections = || runtime.calls().iter().filter(|c| *c == "list_podsandbox").count();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let housekeeping = tokio::spawn(Arc::clone(&p).run_housekeeping(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(collections(), 0, "nobody asked: nothing collected");
    p.collection().await.unwrap();
    assert_eq!(collections(), 1, "the first request collects");
    tokio::time::sleep(Duration::from_secs(12)).await;
    let background = collections();
    assert!(background >= 2, "housekeeping collected in the background: {background}");
    p.collection().await.unwrap();
    assert_eq!(collections(), background, "a scrape reads the latest collection");
    // Two minutes without requests: housekeeping stops.
    tokio::time::sleep(provider::HOUSEKEEPING_IDLE + Duration::from_secs(20)).await;
    let stopped = collections();
    tokio::time::sleep(Duration::from_mins(1)).await;
    assert_eq!(collections(), stopped, "no collections once nobody reads");
    shutdown.cancel();
    housekeeping.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_container_change_makes_the_next_scrape_collect_anew() {
    let f = v1_fixture();
    let runtime = Arc::new(crate::container::fake::FakeRuntime::default());
    let p = provider_for(&f, Arc::clone(&runtime), Collector::new(f.collector.config().clone()))
        .with_housekeeping(provider::HOUSEKEEPING_INTERVAL);
    let collections = || runtime.calls().iter().filter(|c| *c == "list_podsandbox").count();
    p.collection().await.unwrap();
    tokio::time::advance(Duration::from_secs(3)).await;
    p.collection().await.unwrap();
    assert_eq!(collections(), 1, "no change: the collection is served again");
    // A container started (the sync loop saw a PLEG event).
    p.container_changes().fetch_add(1, std::sync::atomic::Ordering::Release);
    p.collection().await.unwrap();
    assert_eq!(collections(), 2, "collected anew after a change");
    p.collection().await.unwrap();
    assert_eq!(collections(), 2, "and that one is served again");
    // Even a change right after a collection.
    p.container_changes().fetch_add(1, std::sync::atomic::Ordering::Release);
    p.collection().await.unwrap();
    assert_eq!(collections(), 3);
}

#[tokio::test(start_paused = true)]
async fn latest_never_collects_but_wakes_housekeeping() {
    let f = v1_fixture();
    let runtime = Arc::new(crate::container::fake::FakeRuntime::default());
    let p = Arc::new(
        provider_for(&f, Arc::clone(&runtime), Collector::new(f.collector.config().clone()))
            .with_housekeeping(provider::HOUSEKEEPING_INTERVAL),
    );
    let collections = || runtime.calls().iter().filter(|c| *c == "list_podsandbox").count();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let housekeeping = tokio::spawn(Arc::clone(&p).run_housekeeping(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(p.latest().is_none(), "nothing collected yet");
    assert_eq!(collections(), 0, "latest() does not collect");
    // Woken, housekeeping collects at once, not at its next tick.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(collections(), 1);
    let first = p.latest().expect("the collection housekeeping made");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(Arc::ptr_eq(&first, &p.latest().unwrap()), "a recent one is reused");
    assert_eq!(collections(), 1);
    // Read now and then, housekeeping keeps collections recent.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(p.latest().is_some());
    }
    shutdown.cancel();
    housekeeping.await.unwrap();
}

/// A small synthetic collection with what the renderers must get exactly right: label
/// values to escape, pods of one name in two namespaces, interfaces and devices out of
/// order, a block I/O row clashing with a filesystem row of the root, a pod cgroup that
/// could not be read, a container without memory stats, values from tiny to huge, and
/// a pod listed twice.
fn tricky_collection() -> Collection {
    let mut c = synthetic::collection(synthetic::Shape { pods: 4, devices: 2, interfaces: 2 });
    c.node.stats.io[0].device = "/dev/sda1".to_owned();
    c.node.boot_time = None;
    if let Some(net) = c.node.network.as_mut() {
        net.interfaces.reverse();
    }
    c.pods[1].name = c.pods[0].name.clone();
    c.pods[1].namespace = "kube-system".to_owned();
    c.pods[2].stats = None;
    c.pods[2].containers[0].image = "reg\\istry/\"quoted\"\nimage:1".to_owned();
    c.pods[2].containers[0].stats.io.reverse();
    c.pods[3].containers[0].stats.memory = None;
    c.pods[3].containers[0].stats.tasks = None;
    c.pods[3].containers[0].start_time = None;
    c.pods[3].network.as_mut().unwrap().interfaces.reverse();
    let cpu = c.pods[3].containers[0].stats.cpu.as_mut().unwrap();
    cpu.total_ns = 1;
    cpu.user_ns = Some(999_999_999_999_999_999);
    cpu.system_ns = Some(0);
    // A pod listed twice: the first's samples are kept.
    let mut twice = c.pods[0].clone();
    twice.containers[0].stats.memory.as_mut().unwrap().usage += 1;
    c.pods.push(twice);
    c
}

fn tricky_machine() -> cadvisor::MachineInfo {
    cadvisor::MachineInfo { os_version: "Some \"OS\" \\ 1".to_owned(), ..cadvisor_machine() }
}

const CADVISOR_GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/golden/cadvisor-tricky.txt");

/// The rendering is compared byte for byte with a kept exposition (written by the
/// renderer before its rewrite for speed, renewed when the spec, process and task
/// families were added, checked with promtool each time; rewrite it with
/// `SWIFTLET_BLESS=1` only for an intended change of output).
#[test]
fn cadvisor_text_is_byte_for_byte_the_kept_one() {
    let text = cadvisor::render_with(&tricky_collection(), &tricky_machine());
    if std::env::var_os("SWIFTLET_BLESS").is_some() {
        std::fs::create_dir_all(Path::new(CADVISOR_GOLDEN).parent().unwrap()).unwrap();
        std::fs::write(CADVISOR_GOLDEN, &text).unwrap();
    }
    let kept = std::fs::read_to_string(CADVISOR_GOLDEN).unwrap();
    if text != kept {
        let first = text.lines().zip(kept.lines()).position(|(a, b)| a != b);
        panic!(
            "differs from {CADVISOR_GOLDEN} at line {first:?}: ours {:?}, kept {:?}",
            first.and_then(|i| text.lines().nth(i)),
            first.and_then(|i| kept.lines().nth(i))
        );
    }
    // The benchmark's node: without the families added since, as the renderer wrote it
    // before its rewrite; with them, as kept.
    let text = cadvisor::render_with(&synthetic::collection(synthetic::Shape::BENCH_250), &tricky_machine());
    let sha = |t: &str| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()));
    let added = [
        "container_cpu_load_average_10s",
        "container_file_descriptors",
        "container_sockets",
        "container_spec_cpu_period",
        "container_spec_cpu_shares",
        "container_spec_memory_reservation_limit_bytes",
        "container_tasks_state",
        "container_threads_max",
        "container_ulimits_soft",
    ];
    let before: String = text
        .lines()
        .filter(|l| {
            let name = l.strip_prefix("# HELP ").or_else(|| l.strip_prefix("# TYPE ")).unwrap_or(l);
            !added.contains(&name.split(['{', ' ']).next().unwrap())
        })
        .flat_map(|l| [l, "\n"])
        .collect();
    assert_eq!(
        (before.len(), sha(&before).as_str()),
        (5_869_377, "3387d71bb73097b9cc218f56a9f708e530fc23a41c07cd3a0e55035e7a1c6134")
    );
    assert_eq!(
        (text.len(), sha(&text).as_str()),
        (7_506_880, "21aa494a73f0be0048c6815388291a0eacf173cc8c0f4780bd730b2ed29a05a5")
    );
}

/// The eviction manager's collections (one every 10 s) walk no processes, and are lean,
/// while nobody reads the stats: the bench found the walk of the root cgroup's
/// descriptors to be a fifth of the agent's idle CPU, and reads of what only readers see
/// most of a collection's. A reader never gets a collection made without them, and
/// while the stats are read the eviction manager's collections walk and serve the scrapes.
#[tokio::test(start_paused = true)]
async fn eviction_collections_walk_processes_only_while_the_stats_are_read() {
    let f = v1_fixture();
    let runtime = Arc::new(crate::container::fake::FakeRuntime::default());
    let p = provider_for(&f, Arc::clone(&runtime), Collector::new(f.collector.config().clone()))
        .with_housekeeping(provider::HOUSEKEEPING_INTERVAL);
    let collections = || runtime.calls().iter().filter(|c| *c == "list_podsandbox").count();
    let root_fds = |c: &Collection| c.node.stats.process_stats.map(|s| s.fds);
    let fresh = p.fresh_collection().await.unwrap();
    assert_eq!(root_fds(&fresh), None, "nobody reads the stats: no walk");
    let read = p.collection().await.unwrap();
    assert_eq!(collections(), 2, "a reader is not served the collection without processes");
    assert_eq!(root_fds(&read), Some(3));
    assert!(fresh.lean && !read.lean, "nobody reads the stats: the eviction manager's collection is lean");
    tokio::time::advance(Duration::from_secs(10)).await;
    let fresh = p.fresh_collection().await.unwrap();
    assert_eq!(root_fds(&fresh), Some(3), "the stats are being read: the eviction manager's collection walks");
    p.collection().await.unwrap();
    assert_eq!(collections(), 3, "and serves the next scrape");
}
