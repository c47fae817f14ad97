//! Synthetic [`Collection`]s: a node of many pods with plausible, deterministic numbers,
//! for the renderers' benchmark (`agent/benches/metrics_render.rs`) and their
//! byte-for-byte tests. Nothing is read from the host.
//!
//! The shape follows a collection of the scrape bench (`cargo xtask bench scrape`) on a
//! cgroup v2 node: one container per pod, the pod and container cgroups under
//! `/kubepods/besteffort`, block I/O rows for the devices the cgroups touched, the pod's
//! `eth0`, the node with its partitions and host interfaces.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::cgroup::{CgroupSpec, CgroupStats, CpuSpec, CpuUsage, DeviceIo, MemoryUsage};
use super::collector::{
    Collection, ContainerSample, FilesystemSample, FsSample, NetworkSample, NodeSample, PodSample, UsageSample,
};
use super::fs::{DiskUsage, FsInfo};
use super::mounts::DiskStats;
use super::processes::ProcessStats;
use super::procfs::Interface;

/// The shape of a synthetic node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Pods, one container each.
    pub pods: usize,
    /// Block devices with I/O rows in every pod and container cgroup.
    pub devices: usize,
    /// Interfaces in every pod's network namespace.
    pub interfaces: usize,
}

impl Shape {
    /// The scrape bench's node at 250 pods: about 22k series and 5.7 MB of
    /// `/metrics/cadvisor`, as measured there.
    pub const BENCH_250: Self = Self { pods: 250, devices: 8, interfaces: 2 };
}

/// The collection's time: 2026-12-01T00:00:10.123Z.
const T0: u64 = 1_796_083_210;

fn at(offset_ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(T0) + Duration::from_millis(123 + offset_ms)
}

/// A deterministic, spread-out number for row `i`, field `k`.
fn n(i: usize, k: u64, scale: u64) -> u64 {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    x % scale.max(1)
}

fn hex64(i: usize, salt: u64) -> String {
    (0..4).fold(String::with_capacity(64), |mut s, k| {
        let _ = write!(s, "{:016x}", n(i, salt + k, u64::MAX));
        s
    })
}

fn uid(i: usize) -> String {
    let h = hex64(i, 100);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

fn cgroup_stats(i: usize, salt: u64, time: SystemTime, devices: usize, processes: bool) -> CgroupStats {
    let usage = 4_000_000 + n(i, salt, 60_000_000);
    let inactive = n(i, salt + 1, usage / 4);
    CgroupStats {
        time,
        cpu: Some(CpuUsage {
            total_ns: 10_000_000 + n(i, salt + 2, 90_000_000_000),
            user_ns: Some(n(i, salt + 3, 50_000_000_000)),
            system_ns: Some(n(i, salt + 4, 20_000_000_000)),
            throttling: None,
            nano_cores: Some(n(i, salt + 5, 50_000_000)),
        }),
        memory: Some(MemoryUsage {
            usage,
            working_set: Some(usage - inactive),
            rss: Some(n(i, salt + 6, usage)),
            cache: Some(n(i, salt + 7, usage)),
            mapped_file: Some(n(i, salt + 8, 4_000_000)),
            inactive_file: Some(inactive),
            pgfault: Some(n(i, salt + 9, 3_000_000)),
            pgmajfault: Some(n(i, salt + 10, 300)),
            max_usage: Some(usage + n(i, salt + 11, 10_000_000)),
            failcnt: None,
            limit: i.is_multiple_of(3).then_some(268_435_456),
            swap: Some(0),
            swap_limit: None,
            oom_kills: Some(0),
        }),
        tasks: Some(1 + n(i, salt + 12, 40)),
        processes: processes.then(|| 1 + n(i, salt + 13, 4)),
        first_pid: None,
        cpu_pressure: None,
        memory_pressure: None,
        io_pressure: None,
        io: (0..devices)
            .map(|d| DeviceIo {
                major: 8,
                minor: 16 * d as u32,
                device: format!("/dev/sd{}", char::from(b'a' + (d % 26) as u8)),
                reads: n(i, salt + 20 + d as u64, 100_000),
                writes: n(i, salt + 40 + d as u64, 1_000_000),
            })
            .collect(),
        spec: Some(CgroupSpec {
            cpu: Some(CpuSpec { period: 100_000, shares: 2 + n(i, salt + 14, 4096) }),
            memory_reservation: None,
            threads_max: Some(0),
        }),
        process_stats: Some(ProcessStats {
            fds: if processes { 3 + n(i, salt + 15, 200) } else { 0 },
            sockets: if processes { n(i, salt + 16, 20) } else { 0 },
            max_open_files: processes.then_some(1_048_576),
        }),
    }
}

fn interface(name: &str, i: usize, salt: u64) -> Interface {
    Interface {
        name: name.to_owned(),
        rx_bytes: n(i, salt, 1 << 34),
        rx_packets: n(i, salt + 1, 1 << 24),
        rx_errors: 0,
        rx_dropped: n(i, salt + 2, 3),
        tx_bytes: n(i, salt + 3, 1 << 34),
        tx_packets: n(i, salt + 4, 1 << 24),
        tx_errors: 0,
        tx_dropped: 0,
    }
}

/// A collection of `shape` (see the module docs).
#[must_use]
pub fn collection(shape: Shape) -> Collection {
    let time = at(0);
    let filesystems = ["/dev/sda1", "/dev/sdb1", "overlay_0-41", "shm", "tmpfs"]
        .iter()
        .enumerate()
        .map(|(k, device)| FilesystemSample {
            device: (*device).to_owned(),
            info: FsInfo {
                capacity: 107_374_182_400 >> k,
                available: 53_687_091_200 >> k,
                usage: 42_949_672_960 >> k,
                inodes: 6_553_600 >> k,
                inodes_free: 6_000_000 >> k,
            },
            disk: (k < 2).then(|| DiskStats {
                major: 8,
                minor: 1 + 16 * k as u32,
                reads_completed: n(k, 1, 1 << 30),
                reads_merged: n(k, 2, 1 << 20),
                sectors_read: n(k, 3, 1 << 36),
                read_time_ms: n(k, 4, 1 << 30),
                writes_completed: n(k, 5, 1 << 30),
                writes_merged: n(k, 6, 1 << 20),
                sectors_written: n(k, 7, 1 << 36),
                write_time_ms: n(k, 8, 1 << 30),
                io_in_progress: n(k, 9, 4),
                io_time_ms: n(k, 10, 1 << 30),
                weighted_io_time_ms: n(k, 11, 1 << 32),
            }),
        })
        .collect();
    let node = NodeSample {
        boot_time: Some(UNIX_EPOCH + Duration::from_secs(T0 - 86_400)),
        stats: cgroup_stats(usize::MAX, 0, time, 2, false),
        memory_capacity: Some(25_769_803_776),
        swap: None,
        network: Some(NetworkSample { time, interfaces: vec![interface("ens4", 0, 500), interface("cni0", 1, 500)] }),
        fs: Some(FsSample { time, info: FsInfo::default() }),
        image_fs: None,
        rlimit: None,
        filesystems,
    };
    let pods = (0..shape.pods)
        .map(|i| {
            let uid = uid(i);
            let cgroup = format!("/kubepods/besteffort/pod{uid}");
            let id = hex64(i, 200);
            let stats_time = at(1 + (i as u64 % 900));
            let name = format!("bench-{i}");
            let container = ContainerSample {
                name: "app".to_owned(),
                cgroup: format!("{cgroup}/{id}"),
                id,
                image: "registry.k8s.io/pause:3.9".to_owned(),
                start_time: Some(UNIX_EPOCH + Duration::from_millis((T0 - 3600) * 1000 + n(i, 300, 3_600_000))),
                stats: cgroup_stats(i, 1000, stats_time, shape.devices, true),
                rootfs: None,
                logs: Some(UsageSample {
                    time: stats_time,
                    usage: Some(DiskUsage { bytes: 4096 * (1 + n(i, 301, 64)), inodes: 2 }),
                }),
            };
            PodSample {
                uid,
                namespace: "default".to_owned(),
                start_time: Some(UNIX_EPOCH + Duration::from_millis((T0 - 3700) * 1000 + n(i, 302, 3_600_000))),
                stats: Some(cgroup_stats(i, 2000, stats_time, shape.devices, false)),
                network: Some(NetworkSample {
                    time: stats_time,
                    interfaces: (0..shape.interfaces)
                        .map(|k| interface(&format!("eth{k}"), i, 600 + 10 * k as u64))
                        .collect(),
                }),
                containers: vec![container],
                volumes: Vec::new(),
                logs: None,
                etc_hosts: None,
                name,
                cgroup,
            }
        })
        .collect();
    Collection { node_name: "bench-node".to_owned(), time, node, system_containers: Vec::new(), pods, lean: false }
}
