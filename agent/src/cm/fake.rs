//! In-memory [`PodContainerManager`] for other modules' tests: records calls, keeps pod
//! cgroups in a map, names them like the real manager, and fails on demand.

use crate::types::pod::uid as pod_uid;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;

use super::cgroupfs::CgroupNames;
use super::{Error, PodContainerManager, Result};
use crate::types::qos::{QosClass, qos_class};

/// A call made to the fake, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    /// `ensure_node_cgroups()`.
    EnsureNodeCgroups,
    /// `ensure_pod_cgroup(pod)` with the pod's uid.
    EnsurePodCgroup(String),
    /// `remove_pod_cgroup(uid)`.
    RemovePodCgroup(String),
    /// `list_pod_cgroups()`.
    ListPodCgroups,
    /// `update_qos_cgroups(pods)` with the pods' uids.
    UpdateQosCgroups(Vec<String>),
    /// `update_pod_cgroup(pod, cfg)` with the pod's uid.
    UpdatePodCgroup(String, super::resources::PodResourceConfig),
}

#[derive(Debug, Default)]
struct State {
    node_cgroups: bool,
    pods: BTreeMap<String, QosClass>,
    calls: Vec<FakeCall>,
    failures: HashMap<&'static str, String>,
    /// Pod cgroup settings by uid (resize).
    configs: BTreeMap<String, super::resources::PodResourceConfig>,
    /// Pod memory usage by uid (resize).
    memory_usage: BTreeMap<String, u64>,
}

/// The fake. `cgroupsPerQOS` is on and the cgroup root is `/` unless built otherwise.
#[derive(Debug)]
pub struct FakePodContainerManager {
    names: CgroupNames,
    cgroups_per_qos: bool,
    state: Mutex<State>,
}

impl Default for FakePodContainerManager {
    fn default() -> Self {
        Self::new("/", true)
    }
}

impl FakePodContainerManager {
    /// A fake with this `cgroupRoot` and `cgroupsPerQOS`; an invalid root is treated as `/`.
    #[must_use]
    pub fn new(cgroup_root: &str, cgroups_per_qos: bool) -> Self {
        let names = CgroupNames::new(cgroup_root).unwrap_or_else(|_| CgroupNames::new("/").expect("root is valid"));
        Self { names, cgroups_per_qos, state: Mutex::default() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the others.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the next call of `op` (the trait method's name, e.g. `"ensure_pod_cgroup"`)
    /// fail with [`Error::Injected`].
    pub fn fail_next(&self, op: &'static str, message: impl Into<String>) {
        self.state().failures.insert(op, message.into());
    }

    fn check(&self, op: &'static str) -> Result<()> {
        match self.state().failures.remove(op) {
            Some(message) => Err(Error::Injected { op, message }),
            None => Ok(()),
        }
    }

    /// Every call so far.
    #[must_use]
    pub fn calls(&self) -> Vec<FakeCall> {
        self.state().calls.clone()
    }

    /// Pod cgroups that exist: uid → `QoS` class.
    #[must_use]
    pub fn pods(&self) -> BTreeMap<String, QosClass> {
        self.state().pods.clone()
    }

    /// Whether `ensure_node_cgroups` succeeded.
    #[must_use]
    pub fn node_cgroups_ensured(&self) -> bool {
        self.state().node_cgroups
    }

    /// Sets what [`PodContainerManager::pod_cgroup_config`] reports for `uid`.
    pub fn set_pod_config(&self, uid: &str, cfg: super::resources::PodResourceConfig) {
        self.state().configs.insert(uid.to_owned(), cfg);
    }

    /// Sets what [`PodContainerManager::pod_memory_usage`] reports for `uid`.
    pub fn set_memory_usage(&self, uid: &str, bytes: u64) {
        self.state().memory_usage.insert(uid.to_owned(), bytes);
    }

    /// Adds a pod cgroup as if left over from an earlier run (an orphan).
    pub fn insert_pod_cgroup(&self, uid: &str, qos: QosClass) {
        self.state().pods.insert(uid.to_owned(), qos);
    }
}

impl PodContainerManager for FakePodContainerManager {
    fn ensure_node_cgroups(&self) -> Result<()> {
        self.state().calls.push(FakeCall::EnsureNodeCgroups);
        self.check("ensure_node_cgroups")?;
        self.state().node_cgroups = true;
        Ok(())
    }

    fn cgroup_parent(&self, pod: &Pod) -> String {
        if !self.cgroups_per_qos {
            return String::new();
        }
        self.names.pod_cgroupfs_name(qos_class(pod), pod_uid(pod))
    }

    fn ensure_pod_cgroup(&self, pod: &Pod) -> Result<()> {
        let uid = pod_uid(pod).to_owned();
        self.state().calls.push(FakeCall::EnsurePodCgroup(uid.clone()));
        self.check("ensure_pod_cgroup")?;
        if self.cgroups_per_qos {
            self.state().pods.entry(uid).or_insert_with(|| qos_class(pod));
        }
        Ok(())
    }

    fn remove_pod_cgroup(&self, uid: &str) -> Result<()> {
        self.state().calls.push(FakeCall::RemovePodCgroup(uid.to_owned()));
        self.check("remove_pod_cgroup")?;
        self.state().pods.remove(uid);
        Ok(())
    }

    fn list_pod_cgroups(&self) -> Result<Vec<(String, QosClass)>> {
        self.state().calls.push(FakeCall::ListPodCgroups);
        self.check("list_pod_cgroups")?;
        Ok(self.state().pods.iter().map(|(u, q)| (u.clone(), *q)).collect())
    }

    fn pod_cgroup_exists(&self, uid: &str) -> bool {
        !self.cgroups_per_qos || self.state().pods.contains_key(uid)
    }

    fn update_qos_cgroups(&self, active_pods: &[Pod]) -> Result<()> {
        self.state()
            .calls
            .push(FakeCall::UpdateQosCgroups(active_pods.iter().map(|p| pod_uid(p).to_owned()).collect()));
        self.check("update_qos_cgroups")
    }

    fn pod_cgroup_config(&self, pod: &Pod) -> Result<Option<super::resources::PodResourceConfig>> {
        Ok(self.state().configs.get(pod_uid(pod)).cloned())
    }

    fn update_pod_cgroup(&self, pod: &Pod, cfg: &super::resources::PodResourceConfig) -> Result<()> {
        let uid = pod_uid(pod).to_owned();
        self.state().calls.push(FakeCall::UpdatePodCgroup(uid.clone(), cfg.clone()));
        self.check("update_pod_cgroup")?;
        let mut state = self.state();
        let cur = state.configs.entry(uid).or_default();
        cur.cpu_shares = cfg.cpu_shares.or(cur.cpu_shares);
        cur.cpu_quota = cfg.cpu_quota.or(cur.cpu_quota);
        cur.cpu_period = cfg.cpu_period.or(cur.cpu_period);
        cur.memory_limit = cfg.memory_limit.or(cur.memory_limit);
        Ok(())
    }

    fn pod_memory_usage(&self, pod: &Pod) -> Result<Option<u64>> {
        Ok(self.state().memory_usage.get(pod_uid(pod)).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::pod_resources::test_pods::{ctr, pod};

    #[test]
    fn behaves_like_the_real_one() {
        let fake = FakePodContainerManager::default();
        let p = pod("u1", vec![ctr("a", &[("cpu", "1")], &[])]);
        assert_eq!(fake.cgroup_parent(&p), "/kubepods/burstable/podu1");
        assert!(!fake.pod_cgroup_exists("u1"));
        fake.ensure_node_cgroups().unwrap();
        fake.ensure_pod_cgroup(&p).unwrap();
        assert!(fake.pod_cgroup_exists("u1"));
        fake.insert_pod_cgroup("orphan", QosClass::BestEffort);
        assert_eq!(
            fake.list_pod_cgroups().unwrap(),
            vec![("orphan".to_owned(), QosClass::BestEffort), ("u1".to_owned(), QosClass::Burstable)]
        );
        fake.remove_pod_cgroup("orphan").unwrap();
        assert_eq!(fake.pods().len(), 1);
        assert_eq!(
            fake.calls(),
            vec![
                FakeCall::EnsureNodeCgroups,
                FakeCall::EnsurePodCgroup("u1".into()),
                FakeCall::ListPodCgroups,
                FakeCall::RemovePodCgroup("orphan".into()),
            ]
        );
        assert!(fake.node_cgroups_ensured());
    }

    #[test]
    fn injected_failures_fire_once() {
        let fake = FakePodContainerManager::default();
        let p = pod("u1", vec![]);
        fake.fail_next("ensure_pod_cgroup", "disk on fire");
        let err = fake.ensure_pod_cgroup(&p).unwrap_err();
        assert_eq!(err.to_string(), "injected failure in ensure_pod_cgroup: disk on fire");
        assert!(!fake.pod_cgroup_exists("u1"));
        fake.ensure_pod_cgroup(&p).unwrap();
        assert!(fake.pod_cgroup_exists("u1"));
    }

    #[test]
    fn cgroups_per_qos_off() {
        let fake = FakePodContainerManager::new("/custom", false);
        let p = pod("u1", vec![]);
        assert_eq!(fake.cgroup_parent(&p), "");
        fake.ensure_pod_cgroup(&p).unwrap();
        assert!(fake.pods().is_empty());
        assert!(fake.pod_cgroup_exists("anything"));
        let on = FakePodContainerManager::new("/custom", true);
        assert_eq!(on.cgroup_parent(&p), "/custom/kubepods/besteffort/podu1");
    }
}
