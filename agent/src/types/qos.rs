//! Pod `QoS` classes: Guaranteed, Burstable, `BestEffort`.
//!
//! [`qos_class`] is upstream `GetPodQOS` (`pkg/apis/core/v1/helper/qos`): it returns
//! `status.qosClass` when the API server has set it (the class is immutable once set, even
//! across in-place resizes) and computes it otherwise with [`compute_qos_class`]
//! (`ComputePodQOS`). Only cpu and memory count; init containers count like regular ones;
//! ephemeral containers cannot have resources and are ignored; pod-level `spec.resources`,
//! when present, decide alone (`PodLevelResources`, on by default since 1.34).

use std::fmt;

use k8s_openapi::api::core::v1::Pod;

use super::pod_resources::{self, ResourceList};
use crate::types::resource_names::{CPU, MEMORY};

/// The `QoS` class of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QosClass {
    /// Every container has equal, non-zero cpu and memory requests and limits.
    Guaranteed,
    /// Anything between the two others.
    Burstable,
    /// No container has any cpu or memory request or limit.
    BestEffort,
}

impl QosClass {
    /// The API spelling (`status.qosClass`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }

    /// Parses the API spelling; `None` for anything else.
    #[must_use]
    pub fn from_api(s: &str) -> Option<Self> {
        match s {
            "Guaranteed" => Some(Self::Guaranteed),
            "Burstable" => Some(Self::Burstable),
            "BestEffort" => Some(Self::BestEffort),
            _ => None,
        }
    }

    /// The lower-case name used for the `QoS` cgroup (`burstable`, `besteffort`); Guaranteed
    /// pods have no `QoS` cgroup of their own and live directly under `kubepods`.
    #[must_use]
    pub fn cgroup_name(self) -> Option<&'static str> {
        match self {
            Self::Guaranteed => None,
            Self::Burstable => Some("burstable"),
            Self::BestEffort => Some("besteffort"),
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pod's `QoS` class: `status.qosClass` if set (and valid), else [`compute_qos_class`].
#[must_use]
pub fn qos_class(pod: &Pod) -> QosClass {
    pod.status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .filter(|s| !s.is_empty())
        .and_then(QosClass::from_api)
        .unwrap_or_else(|| compute_qos_class(pod))
}

fn is_qos_resource(name: &str) -> bool {
    name == CPU || name == MEMORY
}

/// Adds the positive cpu/memory quantities of `from` into `into`.
fn add_qos_resources(into: &mut ResourceList, from: &ResourceList) {
    for (name, q) in from {
        if is_qos_resource(name) && q.is_positive() {
            let entry = into.entry(name.clone()).or_default();
            *entry = entry.saturating_add(*q);
        }
    }
}

/// Both cpu and memory have a positive quantity in `limits`.
fn limits_cpu_and_memory(limits: &ResourceList) -> bool {
    [CPU, MEMORY].iter().all(|r| limits.get(*r).is_some_and(|q| q.is_positive()))
}

/// Computes the class from the spec, ignoring `status.qosClass` (`ComputePodQOS`).
#[must_use]
pub fn compute_qos_class(pod: &Pod) -> QosClass {
    let mut requests = ResourceList::new();
    let mut limits = ResourceList::new();
    let mut guaranteed = true;
    let spec = pod.spec.as_ref();
    if spec.is_some_and(|s| s.resources.is_some()) {
        // Pod-level resources decide alone, even when empty.
        let pod_requests = pod_resources::pod_level_requests(pod);
        let pod_limits = pod_resources::pod_level_limits(pod);
        add_qos_resources(&mut requests, &pod_requests);
        if !pod_limits.is_empty() {
            add_qos_resources(&mut limits, &pod_limits);
            guaranteed &= limits_cpu_and_memory(&pod_limits);
        }
    } else {
        let containers = spec.into_iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
        for c in containers {
            let c_limits = pod_resources::container_limits(c);
            add_qos_resources(&mut requests, &pod_resources::container_requests(c));
            add_qos_resources(&mut limits, &c_limits);
            guaranteed &= limits_cpu_and_memory(&c_limits);
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    let matching = requests.len() == limits.len() && requests.iter().all(|(name, req)| limits.get(name) == Some(req));
    if guaranteed && matching { QosClass::Guaranteed } else { QosClass::Burstable }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::pod_resources::test_pods::*;
    use QosClass::{BestEffort, Burstable, Guaranteed};
    use k8s_openapi::api::core::v1::PodStatus;

    const CPU_MEM_1: &[(&str, &str)] = &[("cpu", "1"), ("memory", "1Gi")];

    /// Upstream's `qos_test.go` cases, by name.
    #[test]
    fn upstream_cases() {
        let cases: Vec<(&str, Pod, QosClass)> = vec![
            ("no resources", pod("u", vec![ctr("a", &[], &[])]), BestEffort),
            (
                "best-effort with only extended resources",
                pod("u", vec![ctr("a", &[("nvidia.com/gpu", "1")], &[("nvidia.com/gpu", "1")])]),
                BestEffort,
            ),
            ("guaranteed", pod("u", vec![ctr("a", CPU_MEM_1, CPU_MEM_1)]), Guaranteed),
            (
                "guaranteed, two containers",
                pod(
                    "u",
                    vec![
                        ctr("a", CPU_MEM_1, CPU_MEM_1),
                        ctr("b", &[("cpu", "100m"), ("memory", "1M")], &[("cpu", "0.1"), ("memory", "1000k")]),
                    ],
                ),
                Guaranteed,
            ),
            (
                "guaranteed with extended resources differing",
                pod(
                    "u",
                    vec![ctr(
                        "a",
                        &[("cpu", "1"), ("memory", "1Gi"), ("x/y", "1")],
                        &[("cpu", "1"), ("memory", "1Gi"), ("x/y", "2")],
                    )],
                ),
                Guaranteed,
            ),
            (
                "guaranteed and best-effort containers",
                pod("u", vec![ctr("a", CPU_MEM_1, CPU_MEM_1), ctr("b", &[], &[])]),
                Burstable,
            ),
            (
                "best-effort and burstable",
                pod("u", vec![ctr("a", &[], &[]), ctr("b", &[("cpu", "1")], &[])]),
                Burstable,
            ),
            (
                "requests lower than limits",
                pod("u", vec![ctr("a", &[("cpu", "100m"), ("memory", "1Gi")], CPU_MEM_1)]),
                Burstable,
            ),
            ("only a cpu limit (request defaults to it)", pod("u", vec![ctr("a", &[], &[("cpu", "1")])]), Burstable),
            ("only a memory request", pod("u", vec![ctr("a", &[("memory", "1Gi")], &[])]), Burstable),
            (
                "limits only on both resources: requests default to limits",
                pod("u", vec![ctr("a", &[], CPU_MEM_1)]),
                Guaranteed,
            ),
            (
                "partial limits in one of two containers",
                pod("u", vec![ctr("a", CPU_MEM_1, CPU_MEM_1), ctr("b", &[("cpu", "1")], &[("cpu", "1")])]),
                Burstable,
            ),
            (
                "zero quantities count as unset",
                pod("u", vec![ctr("a", &[("cpu", "0"), ("memory", "0")], &[("cpu", "0"), ("memory", "0")])]),
                BestEffort,
            ),
            (
                "zero cpu limit with memory guaranteed",
                pod("u", vec![ctr("a", &[("cpu", "0"), ("memory", "1Gi")], &[("cpu", "0"), ("memory", "1Gi")])]),
                Burstable,
            ),
        ];
        for (name, p, want) in cases {
            assert_eq!(compute_qos_class(&p), want, "{name}");
            assert_eq!(qos_class(&p), want, "{name}");
        }
    }

    #[test]
    fn init_containers_count() {
        let guaranteed_init =
            pod_with_init("u", vec![ctr("init", CPU_MEM_1, CPU_MEM_1)], vec![ctr("a", CPU_MEM_1, CPU_MEM_1)]);
        assert_eq!(compute_qos_class(&guaranteed_init), Guaranteed);
        let burstable_init =
            pod_with_init("u", vec![ctr("init", &[("cpu", "100m")], &[])], vec![ctr("a", CPU_MEM_1, CPU_MEM_1)]);
        assert_eq!(compute_qos_class(&burstable_init), Burstable);
        let best_effort_init = pod_with_init("u", vec![ctr("init", &[], &[])], vec![ctr("a", CPU_MEM_1, CPU_MEM_1)]);
        assert_eq!(
            compute_qos_class(&best_effort_init),
            Burstable,
            "an init container without limits breaks Guaranteed"
        );
        let only_init = pod_with_init("u", vec![ctr("init", &[("memory", "1Mi")], &[])], vec![ctr("a", &[], &[])]);
        assert_eq!(compute_qos_class(&only_init), Burstable);
        let sidecar_guaranteed =
            pod_with_init("u", vec![sidecar("s", CPU_MEM_1, CPU_MEM_1)], vec![ctr("a", CPU_MEM_1, CPU_MEM_1)]);
        assert_eq!(compute_qos_class(&sidecar_guaranteed), Guaranteed);
    }

    #[test]
    fn sums_are_compared_not_each_container() {
        // Upstream sums requests and limits over all containers before comparing them, so
        // mismatches that cancel out still count as Guaranteed (as long as every container
        // has both limits).
        let p = pod(
            "u",
            vec![
                ctr("a", &[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "2"), ("memory", "1Gi")]),
                ctr("b", &[("cpu", "2"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1Gi")]),
            ],
        );
        assert_eq!(compute_qos_class(&p), Guaranteed);
    }

    #[test]
    fn pod_level_resources_decide_alone() {
        let p = with_pod_resources(pod("u", vec![ctr("a", &[], &[])]), CPU_MEM_1, CPU_MEM_1);
        assert_eq!(compute_qos_class(&p), Guaranteed);
        let p = with_pod_resources(pod("u", vec![ctr("a", CPU_MEM_1, CPU_MEM_1)]), &[("cpu", "1")], &[]);
        assert_eq!(compute_qos_class(&p), Burstable);
        let p = with_pod_resources(pod("u", vec![ctr("a", CPU_MEM_1, CPU_MEM_1)]), &[], &[]);
        assert_eq!(compute_qos_class(&p), BestEffort, "an empty spec.resources still decides");
        let p = with_pod_resources(
            pod("u", vec![]),
            &[("cpu", "1"), ("memory", "1Gi")],
            &[("cpu", "2"), ("memory", "1Gi")],
        );
        assert_eq!(compute_qos_class(&p), Burstable);
        let p = with_pod_resources(pod("u", vec![]), &[], &[("cpu", "1")]);
        assert_eq!(compute_qos_class(&p), Burstable, "pod-level limits are not defaulted into requests");
    }

    #[test]
    fn status_wins_when_set() {
        let mut p = pod("u", vec![ctr("a", &[], &[])]);
        p.status = Some(PodStatus { qos_class: Some("Guaranteed".to_owned()), ..PodStatus::default() });
        assert_eq!(qos_class(&p), Guaranteed);
        assert_eq!(compute_qos_class(&p), BestEffort);
        p.status.as_mut().unwrap().qos_class = Some(String::new());
        assert_eq!(qos_class(&p), BestEffort);
        p.status.as_mut().unwrap().qos_class = Some("Platinum".to_owned());
        assert_eq!(qos_class(&p), BestEffort, "an unknown class is recomputed");
    }

    #[test]
    fn names() {
        assert_eq!(QosClass::from_api("Burstable"), Some(Burstable));
        assert_eq!(Burstable.to_string(), "Burstable");
        assert_eq!(BestEffort.cgroup_name(), Some("besteffort"));
        assert_eq!(Guaranteed.cgroup_name(), None);
        assert_eq!(QosClass::from_api("burstable"), None);
    }
}
