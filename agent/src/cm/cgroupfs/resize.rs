//! Pod cgroup reads and writes for in-place resize (upstream `GetPodCgroupConfig`,
//! `SetPodCgroupConfig`, `GetPodCgroupMemoryUsage`): the cpu and memory settings of an
//! existing pod cgroup, in every hierarchy that has the controller.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;

use super::mounts::{Hierarchy, HierarchyKind};
use super::{CgroupfsPodContainerManager, Result, read_string};
use crate::cm::resources::{PodResourceConfig, cpu_weight_to_cpu_shares};
use crate::types::pod::uid as pod_uid;
use crate::types::qos::qos_class;

/// v1 `memory.limit_in_bytes` at or above this is "no limit" (`PAGE_COUNTER_MAX` pages).
const V1_UNLIMITED: i64 = 0x7fff_ffff_ffff_f000;

fn parse_i64(s: &str) -> Option<i64> {
    s.trim().parse().ok()
}

impl CgroupfsPodContainerManager {
    /// The pod cgroup directory of `pod` in hierarchy `h`, when it exists.
    fn pod_dir_in(&self, h: &Hierarchy, pod: &Pod) -> Result<Option<PathBuf>> {
        let uid = self.names.checked_uid(pod_uid(pod))?;
        let dir = h.mount.join(self.names.pod_rel(qos_class(pod), uid));
        Ok(dir.is_dir().then_some(dir))
    }

    /// Reads the pod cgroup's cpu shares, quota and period, and memory limit (`-1`: none;
    /// with `v1_unlimited_as_read`, an unlimited v1 limit is the kernel's number).
    /// `None` without pod cgroups.
    pub(crate) fn read_pod_config(&self, pod: &Pod, v1_unlimited_as_read: bool) -> Result<Option<PodResourceConfig>> {
        if self.layout.is_none() || !self.config.cgroups_per_qos {
            return Ok(None);
        }
        let mut cfg = PodResourceConfig::default();
        let mut found = false;
        for h in self.hierarchies() {
            let Some(dir) = self.pod_dir_in(h, pod)? else { continue };
            match &h.kind {
                HierarchyKind::V1(c) => {
                    if c.contains("cpu") {
                        found = true;
                        cfg.cpu_shares =
                            parse_i64(&read_string(&dir.join("cpu.shares"))?).and_then(|v| u64::try_from(v).ok());
                        cfg.cpu_quota = parse_i64(&read_string(&dir.join("cpu.cfs_quota_us"))?);
                        cfg.cpu_period = parse_i64(&read_string(&dir.join("cpu.cfs_period_us"))?)
                            .and_then(|v| u64::try_from(v).ok());
                    }
                    if c.contains("memory") {
                        found = true;
                        cfg.memory_limit = parse_i64(&read_string(&dir.join("memory.limit_in_bytes"))?)
                            .map(|v| if v >= V1_UNLIMITED && !v1_unlimited_as_read { -1 } else { v });
                    }
                }
                HierarchyKind::Unified(_) => {
                    found = true;
                    if let Ok(w) = read_string(&dir.join("cpu.weight"))
                        && let Some(w) = parse_i64(&w).and_then(|v| u64::try_from(v).ok())
                    {
                        cfg.cpu_shares = Some(cpu_weight_to_cpu_shares(w));
                    }
                    if let Ok(max) = read_string(&dir.join("cpu.max")) {
                        let mut it = max.split_whitespace();
                        cfg.cpu_quota = it.next().map(|q| if q == "max" { -1 } else { parse_i64(q).unwrap_or(-1) });
                        cfg.cpu_period = it.next().and_then(|p| p.parse().ok());
                    }
                    if let Ok(m) = read_string(&dir.join("memory.max")) {
                        cfg.memory_limit = Some(if m.trim() == "max" { -1 } else { parse_i64(&m).unwrap_or(-1) });
                    }
                }
                HierarchyKind::HybridUnified => {}
            }
        }
        Ok(found.then_some(cfg))
    }

    /// Writes the `Some` settings of `cfg` into the existing pod cgroup.
    pub(crate) fn write_pod_config(&self, pod: &Pod, cfg: &PodResourceConfig) -> Result<()> {
        if self.layout.is_none() || !self.config.cgroups_per_qos {
            return Ok(());
        }
        let mut cfg = PodResourceConfig { pids_limit: None, ..cfg.clone() };
        // `cpuCFSQuota: false`: pod cgroups stay without a quota, as at creation.
        if !self.config.cpu_cfs_quota && cfg.cpu_quota.is_some() {
            cfg.cpu_quota = Some(-1);
        }
        let mut dirs = Vec::new();
        for h in self.hierarchies() {
            if let Some(dir) = self.pod_dir_in(h, pod)? {
                dirs.push((h, dir));
            }
        }
        if self.systemd.is_some() && !dirs.is_empty() {
            let uid = self.names.checked_uid(pod_uid(pod))?;
            self.set_slice(&self.names.slice(Some((qos_class(pod), Some(uid)))), &cfg)?;
        }
        for (h, dir) in dirs {
            Self::apply_limits(h, &dir, &cfg)?;
        }
        tracing::debug!(pod = %pod_uid(pod), ?cfg, "pod cgroup resized");
        Ok(())
    }

    /// Bytes of memory the pod cgroup uses (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`).
    pub(crate) fn read_pod_memory_usage(&self, pod: &Pod) -> Result<Option<u64>> {
        if self.layout.is_none() || !self.config.cgroups_per_qos {
            return Ok(None);
        }
        for h in self.hierarchies() {
            let file = match &h.kind {
                HierarchyKind::V1(c) if c.contains("memory") => "memory.usage_in_bytes",
                HierarchyKind::Unified(_) => "memory.current",
                _ => continue,
            };
            if let Some(dir) = self.pod_dir_in(h, pod)? {
                return Ok(read_string(&dir.join(file))?.trim().parse().ok());
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::Fixture;
    use crate::cm::PodContainerManager;
    use crate::cm::resources::PodResourceConfig;
    use crate::types::pod_resources::test_pods::{ctr, pod};

    fn burstable() -> k8s_openapi::api::core::v1::Pod {
        pod("b1", vec![ctr("a", &[("cpu", "100m"), ("memory", "64Mi")], &[("cpu", "200m"), ("memory", "128Mi")])])
    }

    #[test]
    fn v1_reads_and_writes_only_what_is_asked() {
        let f = Fixture::hybrid();
        let m = f.node_manager();
        let p = burstable();
        assert_eq!(m.pod_cgroup_config(&p).unwrap(), None, "no pod cgroup yet");
        m.ensure_pod_cgroup(&p).unwrap();
        let cfg = m.pod_cgroup_config(&p).unwrap().unwrap();
        assert_eq!(
            (cfg.cpu_shares, cfg.cpu_quota, cfg.cpu_period, cfg.memory_limit),
            (Some(102), Some(20_000), Some(100_000), Some(128 << 20))
        );
        m.update_pod_cgroup(&p, &PodResourceConfig { memory_limit: Some(192 << 20), ..Default::default() }).unwrap();
        assert_eq!(f.read("memory", "kubepods/burstable/podb1/memory.limit_in_bytes"), (192 << 20).to_string());
        assert_eq!(f.read("cpu", "kubepods/burstable/podb1/cpu.cfs_quota_us"), "20000", "cpu untouched");
        m.update_pod_cgroup(&p, &PodResourceConfig { cpu_shares: Some(153), ..Default::default() }).unwrap();
        assert_eq!(f.read("cpu", "kubepods/burstable/podb1/cpu.shares"), "153");
        std::fs::write(f.path("memory", "kubepods/burstable/podb1/memory.usage_in_bytes"), "4096\n").unwrap();
        assert_eq!(m.pod_memory_usage(&p).unwrap(), Some(4096));
        // What v1 says for no limit: none for resizing, the number itself for the status.
        std::fs::write(f.path("memory", "kubepods/burstable/podb1/memory.limit_in_bytes"), "9223372036854771712\n")
            .unwrap();
        assert_eq!(m.pod_cgroup_config(&p).unwrap().unwrap().memory_limit, Some(-1));
        let status = m.pod_cgroup_status_config(&p).unwrap().unwrap();
        assert_eq!((status.memory_limit, status.cpu_shares), (Some(9_223_372_036_854_771_712), Some(153)));
    }

    #[test]
    fn v2_reads_and_writes_cpu_max_weight_and_memory_max() {
        let f = Fixture::unified();
        let m = f.node_manager();
        let p = burstable();
        m.ensure_pod_cgroup(&p).unwrap();
        let cfg = m.pod_cgroup_config(&p).unwrap().unwrap();
        assert_eq!((cfg.cpu_quota, cfg.cpu_period, cfg.memory_limit), (Some(20_000), Some(100_000), Some(128 << 20)));
        // 102 shares are weight 4, which maps back to about the same shares.
        assert_eq!(f.read("", "kubepods/burstable/podb1/cpu.weight"), "4");
        assert!(cfg.cpu_shares.is_some_and(|s| (80..=110).contains(&s)), "{cfg:?}");
        m.update_pod_cgroup(
            &p,
            &PodResourceConfig { cpu_quota: Some(30_000), cpu_period: Some(100_000), ..Default::default() },
        )
        .unwrap();
        assert_eq!(f.read("", "kubepods/burstable/podb1/cpu.max"), "30000 100000");
        assert_eq!(f.read("", "kubepods/burstable/podb1/memory.max"), (128 << 20).to_string());
        m.update_pod_cgroup(&p, &PodResourceConfig { memory_limit: Some(-1), ..Default::default() }).unwrap();
        assert_eq!(m.pod_cgroup_config(&p).unwrap().unwrap().memory_limit, Some(-1));
        assert_eq!(m.pod_cgroup_status_config(&p).unwrap().unwrap().memory_limit, Some(-1), "v2's max: none");
    }

    #[test]
    fn without_cfs_quota_the_pod_keeps_no_quota() {
        let f = Fixture::hybrid();
        let m = f.node_manager_with(crate::cm::CgroupConfig { cpu_cfs_quota: false, ..f.config() });
        let p = burstable();
        m.ensure_pod_cgroup(&p).unwrap();
        let cfg = PodResourceConfig { cpu_quota: Some(30_000), cpu_period: Some(100_000), ..Default::default() };
        m.update_pod_cgroup(&p, &cfg).unwrap();
        assert_eq!(f.read("cpu", "kubepods/burstable/podb1/cpu.cfs_quota_us"), "-1");
    }
}
