//! A [`Collection`] as the Summary API (upstream `summaryProviderImpl.Get` over the CRI
//! stats provider with cAdvisor's numbers, and `GetCPUAndMemoryStats` for
//! `?only_cpu_and_memory=true`).
//!
//! How fields are filled, as upstream:
//! - `availableBytes` of memory is limit − working set, omitted without a limit (the
//!   node's limit is `MemTotal`); of swap, swap limit − swap usage.
//! - containers' `rootfs` takes capacity and free space from the image filesystem and
//!   usage from the writable layer; `logs` and `ephemeral-storage` take capacity from the
//!   root filesystem; ephemeral storage adds up writable layers, container logs (bytes and
//!   inodes), local ephemeral volumes, files in the pod log directory and `etc-hosts`,
//!   its time the latest of theirs (`calcEphemeralStorage`).
//! - volumes: local ephemeral ones first, then the others, each in inventory order.
//! - `process_stats` sums the containers' process counts.
//! - a pod whose own cgroup could not be read gets CPU and memory summed from its
//!   containers (`addPodCPUMemoryStats`'s fallback).
//!
//! Deviations: the node's `startTime` is the boot time in both variants (upstream's
//! CPU-and-memory variant uses the root cgroup's cAdvisor creation time); swap stays in
//! the CPU-and-memory variant (newer upstream keeps it at node level, and
//! `/metrics/resource` needs it); a container whose writable layer is unknown has a
//! `rootfs` with capacity only.

use std::time::SystemTime;

use super::cgroup::{CgroupStats, Pressure, PsiLine};
use super::collector::{Collection, ContainerSample, NetworkSample, PodSample, UsageSample};
use super::fs::FsInfo;
use super::procfs::DEFAULT_INTERFACE;
use super::summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, IoStats, MemoryStats, NetworkStats, NodeStats, PodReference,
    PodStats, ProcessStats, PsiData, PsiStats, RlimitStats, RuntimeStats, SwapStats, Time, VolumeStats,
};

fn t(time: SystemTime) -> Time {
    Time::from(time)
}

fn psi_data(l: &PsiLine) -> PsiData {
    PsiData { total: l.total, avg10: l.avg10, avg60: l.avg60, avg300: l.avg300 }
}

fn psi(p: Option<&Pressure>) -> Option<PsiStats> {
    p.map(|p| PsiStats { some: psi_data(&p.some), full: psi_data(&p.full) })
}

fn cpu(s: &CgroupStats) -> Option<CpuStats> {
    let c = s.cpu.as_ref()?;
    Some(CpuStats {
        time: t(s.time),
        usage_nano_cores: c.nano_cores,
        usage_core_nano_seconds: Some(c.total_ns),
        psi: psi(s.cpu_pressure.as_ref()),
    })
}

/// Memory stats; `limit` overrides the cgroup's (the node's capacity).
fn memory(s: &CgroupStats, limit: Option<u64>) -> Option<MemoryStats> {
    let m = s.memory.as_ref()?;
    let limit = limit.or(m.limit);
    Some(MemoryStats {
        time: t(s.time),
        available_bytes: limit.zip(m.working_set).map(|(l, ws)| l.saturating_sub(ws)),
        usage_bytes: Some(m.usage),
        working_set_bytes: m.working_set,
        rss_bytes: m.rss,
        page_faults: m.pgfault,
        major_page_faults: m.pgmajfault,
        psi: psi(s.memory_pressure.as_ref()),
    })
}

/// Swap stats of a cgroup. Without a swap reading, usage is 0 when the node has no swap
/// at all (nothing can be swapped out), otherwise unknown.
fn swap(s: &CgroupStats, node_has_swap: bool) -> Option<SwapStats> {
    let m = s.memory.as_ref()?;
    let usage = m.swap.or((!node_has_swap).then_some(0))?;
    Some(SwapStats {
        time: t(s.time),
        swap_available_bytes: m.swap_limit.map(|l| l.saturating_sub(usage)),
        swap_usage_bytes: Some(usage),
    })
}

fn io(s: &CgroupStats) -> Option<IoStats> {
    s.io_pressure.as_ref().map(|p| IoStats { time: t(s.time), psi: psi(Some(p)) })
}

fn network(n: &NetworkSample) -> NetworkStats {
    let interfaces: Vec<InterfaceStats> = n
        .interfaces
        .iter()
        .map(|i| InterfaceStats {
            name: i.name.clone(),
            rx_bytes: Some(i.rx_bytes),
            rx_errors: Some(i.rx_errors),
            tx_bytes: Some(i.tx_bytes),
            tx_errors: Some(i.tx_errors),
        })
        .collect();
    let default_interface = interfaces.iter().find(|i| i.name == DEFAULT_INTERFACE).cloned().unwrap_or_default();
    NetworkStats { time: t(n.time), default_interface, interfaces }
}

/// Capacity side of an [`FsStats`] from a filesystem.
fn fs_base(time: Time, info: Option<FsInfo>) -> FsStats {
    FsStats {
        time,
        available_bytes: info.map(|i| i.available),
        capacity_bytes: info.map(|i| i.capacity),
        used_bytes: None,
        inodes_free: info.map(|i| i.inodes_free),
        inodes: info.map(|i| i.inodes),
        inodes_used: None,
    }
}

/// Upstream `addUsage`: `None` + `None` stays `None`.
fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

fn add_usage(fs: &mut FsStats, u: &UsageSample) {
    fs.used_bytes = add(fs.used_bytes, u.usage.map(|u| u.bytes));
    fs.inodes_used = add(fs.inodes_used, u.usage.map(|u| u.inodes));
    fs.time = fs.time.max(t(u.time));
}

struct Ctx {
    collection_time: SystemTime,
    root_fs: Option<(SystemTime, FsInfo)>,
    image_fs: Option<(SystemTime, FsInfo)>,
    node_has_swap: bool,
}

impl Ctx {
    fn root_fs_time(&self) -> Time {
        t(self.root_fs.map_or(self.collection_time, |f| f.0))
    }
}

fn container(c: &ContainerSample, ctx: &Ctx, full: bool) -> ContainerStats {
    let mut out = ContainerStats {
        name: c.name.clone(),
        start_time: c.start_time.map_or(Time::zero(), t),
        cpu: cpu(&c.stats),
        memory: memory(&c.stats, None),
        swap: swap(&c.stats, ctx.node_has_swap),
        ..ContainerStats::default()
    };
    if !full {
        return out;
    }
    out.io = io(&c.stats);
    let image_fs = ctx.image_fs.or(ctx.root_fs);
    let mut rootfs = fs_base(t(image_fs.map_or(ctx.collection_time, |f| f.0)), image_fs.map(|f| f.1));
    if let Some(r) = &c.rootfs {
        rootfs.time = t(r.time);
        rootfs.used_bytes = r.usage.map(|u| u.bytes);
        rootfs.inodes_used = r.usage.map(|u| u.inodes);
    }
    out.rootfs = Some(rootfs);
    out.logs = c.logs.as_ref().map(|l| {
        let mut logs = fs_base(ctx.root_fs_time(), ctx.root_fs.map(|f| f.1));
        add_usage(&mut logs, l);
        logs
    });
    out
}

/// Pod CPU and memory summed from its containers, when the pod cgroup is unreadable.
fn sum_containers(containers: &[ContainerStats]) -> (Option<CpuStats>, Option<MemoryStats>) {
    let mut cpu: Option<CpuStats> = None;
    let mut mem: Option<MemoryStats> = None;
    for c in containers {
        if let Some(cc) = &c.cpu {
            let p = cpu.get_or_insert_with(CpuStats::default);
            p.time = cc.time;
            p.usage_core_nano_seconds =
                Some(p.usage_core_nano_seconds.unwrap_or(0) + cc.usage_core_nano_seconds.unwrap_or(0));
            p.usage_nano_cores = Some(p.usage_nano_cores.unwrap_or(0) + cc.usage_nano_cores.unwrap_or(0));
        }
        if let Some(cm) = &c.memory {
            let p = mem.get_or_insert_with(MemoryStats::default);
            p.time = cm.time;
            let sum = |a: Option<u64>, b: Option<u64>| Some(a.unwrap_or(0) + b.unwrap_or(0));
            p.available_bytes = sum(p.available_bytes, cm.available_bytes);
            p.usage_bytes = sum(p.usage_bytes, cm.usage_bytes);
            p.working_set_bytes = sum(p.working_set_bytes, cm.working_set_bytes);
            p.rss_bytes = sum(p.rss_bytes, cm.rss_bytes);
            p.page_faults = sum(p.page_faults, cm.page_faults);
            p.major_page_faults = sum(p.major_page_faults, cm.major_page_faults);
        }
    }
    (cpu, mem)
}

fn pod(p: &PodSample, ctx: &Ctx, full: bool) -> PodStats {
    let containers: Vec<ContainerStats> = p.containers.iter().map(|c| container(c, ctx, full)).collect();
    let (cpu_stats, memory_stats) = match &p.stats {
        Some(s) => (cpu(s), memory(s, None)),
        None => sum_containers(&containers),
    };
    let mut out = PodStats {
        pod_ref: PodReference { name: p.name.clone(), namespace: p.namespace.clone(), uid: p.uid.clone() },
        start_time: p.start_time.map_or(Time::zero(), t),
        cpu: cpu_stats,
        memory: memory_stats,
        swap: p.stats.as_ref().and_then(|s| swap(s, ctx.node_has_swap)),
        containers,
        ..PodStats::default()
    };
    if !full {
        return out;
    }
    out.io = p.stats.as_ref().and_then(io);
    out.network = p.network.as_ref().map(network);

    let volume = |v: &super::collector::VolumeSample| {
        let mut fs = fs_base(t(v.usage.time), v.fs);
        fs.used_bytes = v.usage.usage.map(|u| u.bytes);
        fs.inodes_used = v.usage.usage.map(|u| u.inodes);
        VolumeStats { fs, name: v.name.clone(), pvc_ref: v.pvc.clone(), volume_health_stats: None }
    };
    let ephemeral_volumes: Vec<VolumeStats> = p.volumes.iter().filter(|v| v.local_ephemeral).map(volume).collect();
    let mut ephemeral = fs_base(ctx.root_fs_time(), ctx.root_fs.map(|f| f.1));
    for c in &out.containers {
        if let Some(r) = &c.rootfs {
            ephemeral.time = ephemeral.time.max(r.time);
            ephemeral.used_bytes = add(ephemeral.used_bytes, r.used_bytes);
            ephemeral.inodes_used = add(ephemeral.inodes_used, r.inodes_used);
            if let Some(l) = &c.logs {
                ephemeral.used_bytes = add(ephemeral.used_bytes, l.used_bytes);
                ephemeral.inodes_used = add(ephemeral.inodes_used, l.inodes_used);
                ephemeral.time = ephemeral.time.max(l.time);
            }
        }
    }
    for v in &ephemeral_volumes {
        ephemeral.used_bytes = add(ephemeral.used_bytes, v.fs.used_bytes);
        ephemeral.inodes_used = add(ephemeral.inodes_used, v.fs.inodes_used);
        ephemeral.time = ephemeral.time.max(v.fs.time);
    }
    for u in [&p.logs, &p.etc_hosts].into_iter().flatten() {
        add_usage(&mut ephemeral, u);
    }
    out.ephemeral_storage = Some(ephemeral);
    out.volume_stats = ephemeral_volumes;
    out.volume_stats.extend(p.volumes.iter().filter(|v| !v.local_ephemeral).map(volume));

    let counts: Vec<u64> = p.containers.iter().filter_map(|c| c.stats.processes).collect();
    if !counts.is_empty() {
        out.process_stats = Some(ProcessStats { process_count: Some(counts.iter().sum()) });
    }
    out
}

/// The Summary of a collection: everything (`full`) or CPU and memory only.
pub(crate) fn summary(c: &Collection, full: bool) -> super::summary::Summary {
    let node = &c.node;
    let ctx = Ctx {
        collection_time: c.time,
        root_fs: node.fs.map(|f| (f.time, f.info)),
        image_fs: node.image_fs.and_then(|i| i.info.map(|info| (i.time, info))),
        node_has_swap: node.swap.is_some_and(|s| s.usage + s.available > 0),
    };
    let system_containers = c
        .system_containers
        .iter()
        .map(|sc| ContainerStats {
            name: sc.name.clone(),
            start_time: sc.start_time.map_or(Time::zero(), t),
            cpu: cpu(&sc.stats),
            memory: memory(&sc.stats, None),
            swap: swap(&sc.stats, ctx.node_has_swap),
            io: if full { io(&sc.stats) } else { None },
            ..ContainerStats::default()
        })
        .collect();
    let mut out = NodeStats {
        node_name: c.node_name.clone(),
        system_containers,
        start_time: node.boot_time.map_or(Time::zero(), t),
        cpu: cpu(&node.stats),
        memory: memory(&node.stats, node.memory_capacity),
        swap: node.swap.map(|s| SwapStats {
            time: t(node.stats.time),
            swap_available_bytes: Some(s.available),
            swap_usage_bytes: Some(s.usage),
        }),
        ..NodeStats::default()
    };
    if full {
        out.io = io(&node.stats);
        out.network = node.network.as_ref().map(network);
        out.fs = node.fs.map(|f| {
            let mut fs = fs_base(t(f.time), Some(f.info));
            fs.used_bytes = Some(f.info.usage);
            fs.inodes_used = Some(f.info.inodes.saturating_sub(f.info.inodes_free));
            fs
        });
        out.runtime = node.image_fs.map(|i| {
            let mut fs = fs_base(t(i.time), i.info);
            fs.used_bytes = i.used_bytes;
            fs.inodes_used = i.inodes_used;
            RuntimeStats { image_fs: Some(fs), container_fs: None }
        });
        out.rlimit =
            node.rlimit.map(|r| RlimitStats { time: t(r.time), max_pid: r.max_pid, num_of_running_processes: r.tasks });
    }
    super::summary::Summary { node: out, pods: c.pods.iter().map(|p| pod(p, &ctx, full)).collect() }
}
