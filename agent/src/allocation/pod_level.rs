//! The pod-level resources of a pod's status, which upstream reports for every pod with
//! `InPlacePodLevelResourcesVerticalScaling` (beta, on by default since 1.36):
//!
//! - `status.allocatedResources`: the allocated pod's total requests (`PodRequests`:
//!   containers per KEP-753, pod-level requests overriding, plus overhead), printed as
//!   Go's sums print;
//! - `status.resources` (upstream `convertToAPIPodLevelResourcesStatus`): before the pod
//!   runs, its allocated requests and limits; while it runs, what its pod cgroup says —
//!   the cpu request from the cpu shares and the cpu limit from the CFS quota when either
//!   is above the cgroup minimum, and the memory limit (on cgroup v1 an unlimited pod
//!   shows the kernel's 9223372036854771712 bytes, as upstream shows it) — over the
//!   pod-level spec, with the memory request from the totals. A value the cgroup cannot
//!   give is kept from the previous status while the pod runs.
//!
//! "Runs" is the phase of the pod object the kubelet holds (the API's, before this
//! status), as upstream decides it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{binary_quantity, milli_quantity, shares_to_milli_cpu};
use crate::cm::resources::{
    PodResourceConfig, cpu_shares_to_cpu_weight, cpu_weight_to_cpu_shares, milli_cpu_to_shares,
};
use crate::types::pod_resources::{pod_limits_api, pod_requests_api};
use crate::types::quantity;

/// Requests at or below this many millicores are the cgroup minimum (`MinShares`).
const MIN_SHARES_MILLI: i64 = 2;
/// Limits at or below this many millicores are the cgroup minimum (`MinMilliCPULimit`).
const MIN_MILLI_CPU_LIMIT: i64 = 10;

/// Sets `status.allocatedResources` and `status.resources` of `allocated` (the pod with
/// its allocated resources). `cgroup` reads the pod cgroup as
/// [`crate::cm::PodContainerManager::pod_cgroup_status_config`] does (only for a running
/// pod); `old` is the previous status.
pub fn set_pod_level_status(
    allocated: &Pod,
    cgroup: impl FnOnce() -> Option<PodResourceConfig>,
    old: Option<&PodStatus>,
    status: &mut PodStatus,
) {
    let totals = pod_requests_api(allocated);
    status.resources = Some(pod_level_resources(allocated, &totals, cgroup, old));
    status.allocated_resources = Some(totals).filter(|r| !r.is_empty());
}

fn milli(list: &BTreeMap<String, Quantity>, name: &str) -> i64 {
    list.get(name).and_then(|q| quantity::parse(&q.0).ok()).map_or(0, quantity::ParsedQuantity::milli_value_saturating)
}

/// Empty lists are left out, as Go's `omitempty` leaves them.
fn requirements(
    mut base: ResourceRequirements,
    requests: BTreeMap<String, Quantity>,
    limits: BTreeMap<String, Quantity>,
) -> ResourceRequirements {
    base.requests = Some(requests).filter(|r| !r.is_empty());
    base.limits = Some(limits).filter(|l| !l.is_empty());
    base
}

/// `totals` is the pod's [`pod_requests_api`].
fn pod_level_resources(
    allocated: &Pod,
    totals: &BTreeMap<String, Quantity>,
    cgroup: impl FnOnce() -> Option<PodResourceConfig>,
    old: Option<&PodStatus>,
) -> ResourceRequirements {
    let spec_resources = allocated.spec.as_ref().and_then(|s| s.resources.clone()).unwrap_or_default();
    let running = allocated.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    if !running {
        return requirements(spec_resources, totals.clone(), pod_limits_api(allocated));
    }
    let cgroup = cgroup();
    let cgroup = cgroup.as_ref();
    // Upstream `CPURequestsFromConfig`, `CPULimitsFromConfig`, `MemoryLimitsFromConfig`.
    let cpu_request = cgroup
        .and_then(|c| c.cpu_shares)
        .filter(|s| *s > 0)
        .map(|s| shares_to_milli_cpu(i64::try_from(s).unwrap_or(i64::MAX)))
        .filter(|m| *m > 0);
    let cpu_limit = cgroup
        .and_then(|c| Some((c.cpu_quota?, c.cpu_period?)))
        .filter(|(_, period)| *period > 0)
        .map(|(quota, period)| if quota == -1 { 0 } else { quota * 1000 / i64::try_from(period).unwrap_or(i64::MAX) })
        .filter(|m| *m > 0);
    let memory_limit = cgroup.and_then(|c| c.memory_limit).filter(|m| *m > 0);

    let old_resources = old.filter(|o| o.phase.as_deref() == Some("Running")).and_then(|o| o.resources.as_ref());
    let keep_old = |list: Option<&BTreeMap<String, Quantity>>, name: &str, into: &mut BTreeMap<String, Quantity>| {
        if let Some(q) = list.and_then(|l| l.get(name)) {
            into.insert(name.to_owned(), q.clone());
        }
    };
    let mut requests = spec_resources.requests.clone().unwrap_or_default();
    let mut limits = spec_resources.limits.clone().unwrap_or_default();
    match cpu_request {
        Some(actual) => {
            let allocated_milli = milli(&requests, "cpu");
            // On v1 the shares read back as written; on v2 through `cpu.weight`, whose
            // coarse steps upstream does not count as a change.
            if (actual > MIN_SHARES_MILLI || allocated_milli > MIN_SHARES_MILLI)
                && !shares_survive_v2_round_trip(allocated_milli, cgroup.and_then(|c| c.cpu_shares))
            {
                requests.insert("cpu".into(), milli_quantity(actual));
            }
        }
        None => keep_old(old_resources.and_then(|r| r.requests.as_ref()), "cpu", &mut requests),
    }
    if !requests.contains_key("memory")
        && let Some(m) = totals.get("memory")
    {
        requests.insert("memory".into(), m.clone());
    }
    match cpu_limit {
        Some(actual) => {
            if actual > MIN_MILLI_CPU_LIMIT || milli(&limits, "cpu") > MIN_MILLI_CPU_LIMIT {
                limits.insert("cpu".into(), milli_quantity(actual));
            }
        }
        None => keep_old(old_resources.and_then(|r| r.limits.as_ref()), "cpu", &mut limits),
    }
    match memory_limit {
        Some(actual) => {
            limits.insert("memory".into(), binary_quantity(actual));
        }
        None => keep_old(old_resources.and_then(|r| r.limits.as_ref()), "memory", &mut limits),
    }
    requirements(spec_resources, requests, limits)
}

/// Upstream `CPUSharesEqualAfterV2RoundTrip`: the shares read back equal the allocated
/// request's shares after a trip through `cpu.weight` and back.
fn shares_survive_v2_round_trip(allocated_milli: i64, read_back: Option<u64>) -> bool {
    read_back == Some(cpu_weight_to_cpu_shares(cpu_shares_to_cpu_weight(milli_cpu_to_shares(allocated_milli))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::pod_resources::test_pods::{ctr, pod, with_pod_resources};
    use k8s_openapi::api::core::v1::PodStatus;

    fn running(mut p: Pod) -> Pod {
        p.status = Some(PodStatus { phase: Some("Running".into()), ..Default::default() });
        p
    }

    fn text(list: Option<&BTreeMap<String, Quantity>>, name: &str) -> Option<String> {
        list.and_then(|l| l.get(name)).map(|q| q.0.clone())
    }

    /// What the upstream kubelet v1.37.2 showed on this cgroup v1 host: a pending pod its
    /// allocated totals, a running best-effort pod the kernel's "no limit" as its memory
    /// limit and nothing else.
    #[test]
    fn pending_pods_show_their_totals_and_running_ones_their_cgroup() {
        let guaranteed =
            pod("g", vec![ctr("c", &[("cpu", "20m"), ("memory", "35Mi")], &[("cpu", "20m"), ("memory", "35Mi")])]);
        let mut s = PodStatus::default();
        set_pod_level_status(&guaranteed, || None, None, &mut s);
        let alloc = s.allocated_resources.as_ref();
        assert_eq!((text(alloc, "cpu"), text(alloc, "memory")), (Some("20m".into()), Some("35Mi".into())));
        let r = s.resources.unwrap();
        assert_eq!(r.requests, r.limits);
        assert_eq!(text(r.limits.as_ref(), "memory").as_deref(), Some("35Mi"));

        let best_effort = running(pod("b", vec![ctr("c", &[], &[])]));
        let v1_unlimited = PodResourceConfig {
            cpu_shares: Some(2),
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            memory_limit: Some(9_223_372_036_854_771_712),
            ..Default::default()
        };
        let mut s = PodStatus::default();
        set_pod_level_status(&best_effort, || Some(v1_unlimited), None, &mut s);
        assert_eq!(s.allocated_resources, None, "no requests: left out");
        let r = s.resources.unwrap();
        assert_eq!(r.requests, None);
        assert_eq!(
            r.limits.unwrap().into_iter().collect::<Vec<_>>(),
            [("memory".to_owned(), Quantity("9007199254740988Ki".into()))]
        );

        let pending_best_effort = pod("p", vec![ctr("c", &[], &[])]);
        let mut s = PodStatus::default();
        set_pod_level_status(&pending_best_effort, || panic!("read only while running"), None, &mut s);
        assert_eq!(s.resources, Some(ResourceRequirements::default()), "`resources: {{}}`");
    }

    /// A running pod shows what its cgroup has: a resized limit not yet written shows the
    /// old one; the cpu request comes from the shares, the memory request from the totals.
    #[test]
    fn a_running_pod_shows_its_cgroup_over_its_pod_level_spec() {
        let p = running(with_pod_resources(
            pod("r", vec![ctr("c", &[("memory", "32Mi")], &[])]),
            &[("cpu", "500m")],
            &[("cpu", "1"), ("memory", "128Mi")],
        ));
        let cgroup = PodResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
            ..Default::default()
        };
        let mut s = PodStatus::default();
        set_pod_level_status(&p, || Some(cgroup), None, &mut s);
        let r = s.resources.unwrap();
        assert_eq!(text(r.requests.as_ref(), "cpu").as_deref(), Some("500m"));
        assert_eq!(text(r.requests.as_ref(), "memory").as_deref(), Some("32Mi"));
        assert_eq!(text(r.limits.as_ref(), "cpu").as_deref(), Some("500m"), "the quota, not the spec's 1");
        assert_eq!(text(r.limits.as_ref(), "memory").as_deref(), Some("64Mi"));
        assert_eq!(text(s.allocated_resources.as_ref(), "cpu").as_deref(), Some("500m"));

        // No cgroup to read (gone, or cgroupsPerQOS off): the previous values stay.
        let old = PodStatus { phase: Some("Running".into()), resources: Some(r), ..Default::default() };
        let mut s = PodStatus::default();
        set_pod_level_status(&p, || None, Some(&old), &mut s);
        let kept = s.resources.unwrap();
        assert_eq!(text(kept.limits.as_ref(), "cpu").as_deref(), Some("500m"));
        assert_eq!(text(kept.limits.as_ref(), "memory").as_deref(), Some("64Mi"));
    }

    #[test]
    fn v2_weight_steps_are_not_a_change_of_the_request() {
        // 100m is 102 shares, weight 4, which reads back as 80 shares.
        assert!(shares_survive_v2_round_trip(100, Some(80)));
        assert!(!shares_survive_v2_round_trip(100, Some(102)), "v1 reads back 102: the cgroup's value is shown");
    }
}
