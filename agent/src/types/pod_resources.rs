//! Pod resource accounting: effective container requests and limits, and the pod totals.
//!
//! Mirrors `k8s.io/component-helpers/resource` `PodRequests` / `PodLimits` (the sidecar
//! formula of KEP-753: regular containers and restartable init containers add up, plain init
//! containers only raise the floor; pod-level `spec.resources` override; `spec.overhead` is
//! added) with the `PodLevelResources` feature on, as it is by default since 1.34.
//!
//! Container requests are *defaulted from limits* as the API server's `SetDefaults_Pod`
//! does (and the kubelet does for static pods when it decodes them), so a pod that skipped
//! defaulting is classified and sized exactly as upstream sees it. Pod-level requests are not
//! defaulted.
//!
//! Quantities that do not parse are treated as absent (Go can never hold one): call
//! [`validate_pod_resources`] at admission to reject such pods with a clear message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::types::quantity::{self, ParsedQuantity};
use crate::types::resource_names::{CPU, MEMORY, is_hugepage_resource_name};

/// Parsed resource list: resource name → quantity.
pub type ResourceList = BTreeMap<String, ParsedQuantity>;

/// A quantity the aggregation sums: the exact value ([`ParsedQuantity`], what resource
/// math needs) or the value with Go's print format ([`quantity::Quantity`], for what the
/// API shows: `status.allocatedResources` prints a sum as Go's `Add` leaves it).
pub trait Amount: Copy + Ord {
    /// Parses a quantity string.
    ///
    /// # Errors
    /// When `text` is not a quantity.
    fn parse_amount(text: &str) -> quantity::Result<Self>;
    /// Go's `Add`: the left side keeps its format.
    #[must_use]
    fn plus(self, other: Self) -> Self;
    /// `IsZero()`.
    fn is_nothing(self) -> bool;
}

impl Amount for ParsedQuantity {
    fn parse_amount(text: &str) -> quantity::Result<Self> {
        quantity::parse(text)
    }
    fn plus(self, other: Self) -> Self {
        self.saturating_add(other)
    }
    fn is_nothing(self) -> bool {
        self.is_zero()
    }
}

impl Amount for quantity::Quantity {
    fn parse_amount(text: &str) -> quantity::Result<Self> {
        Self::parse(text)
    }
    fn plus(self, other: Self) -> Self {
        self + other
    }
    fn is_nothing(self) -> bool {
        self.is_zero()
    }
}

/// Parses a raw resource list, dropping entries whose quantity does not parse.
#[must_use]
pub fn parse_list(raw: Option<&BTreeMap<String, Quantity>>) -> ResourceList {
    parse_list_as(raw)
}

fn parse_list_as<Q: Amount>(raw: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<String, Q> {
    let Some(raw) = raw else {
        return BTreeMap::new();
    };
    raw.iter()
        .filter_map(|(name, q)| match Q::parse_amount(&q.0) {
            Ok(parsed) => Some((name.clone(), parsed)),
            Err(error) => {
                // Debug only: this runs on every sync; admission reports it once.
                tracing::debug!(resource = %name, %error, "ignoring unparsable quantity");
                None
            }
        })
        .collect()
}

/// The quantity of `name` in `list`, zero when absent (Go's `list.Cpu()` / `list.Memory()`).
#[must_use]
pub fn get(list: &ResourceList, name: &str) -> ParsedQuantity {
    list.get(name).copied().unwrap_or_default()
}

fn requirements(c: &Container) -> Option<&ResourceRequirements> {
    c.resources.as_ref()
}

/// The container's limits.
#[must_use]
pub fn container_limits(c: &Container) -> ResourceList {
    limits_as(c)
}

fn limits_as<Q: Amount>(c: &Container) -> BTreeMap<String, Q> {
    parse_list_as(requirements(c).and_then(|r| r.limits.as_ref()))
}

/// The container's requests as written, without defaulting.
#[must_use]
pub fn container_raw_requests(c: &Container) -> ResourceList {
    parse_list(requirements(c).and_then(|r| r.requests.as_ref()))
}

/// The container's requests after API defaulting: a resource with a limit but no request
/// requests its limit.
#[must_use]
pub fn container_requests(c: &Container) -> ResourceList {
    requests_as(c)
}

fn requests_as<Q: Amount>(c: &Container) -> BTreeMap<String, Q> {
    let mut requests: BTreeMap<String, Q> = parse_list_as(requirements(c).and_then(|r| r.requests.as_ref()));
    for (name, limit) in limits_as(c) {
        requests.entry(name).or_insert(limit);
    }
    requests
}

/// True for a restartable init container (a sidecar, `restartPolicy: Always`).
#[must_use]
pub fn is_restartable_init_container(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Whether pod-level resource management applies to `name` (cpu, memory, hugepages-*).
#[must_use]
pub fn is_supported_pod_level_resource(name: &str) -> bool {
    name == CPU || name == MEMORY || is_hugepage_resource_name(name)
}

fn pod_level(pod: &Pod) -> Option<&ResourceRequirements> {
    pod.spec.as_ref()?.resources.as_ref()
}

fn has_supported_key(list: Option<&BTreeMap<String, Quantity>>) -> bool {
    list.is_some_and(|l| l.keys().any(|k| is_supported_pod_level_resource(k)))
}

/// Pod-level requests or limits are set for a supported resource (`IsPodLevelResourcesSet`).
#[must_use]
pub fn is_pod_level_resources_set(pod: &Pod) -> bool {
    pod_level(pod).is_some_and(|r| has_supported_key(r.requests.as_ref()) || has_supported_key(r.limits.as_ref()))
}

/// Pod-level requests are set for a supported resource (`IsPodLevelRequestsSet`).
#[must_use]
pub fn is_pod_level_requests_set(pod: &Pod) -> bool {
    pod_level(pod).is_some_and(|r| has_supported_key(r.requests.as_ref()))
}

/// Pod-level requests (only supported resources count).
#[must_use]
pub fn pod_level_requests(pod: &Pod) -> ResourceList {
    parse_list(pod_level(pod).and_then(|r| r.requests.as_ref()))
}

/// Pod-level limits.
#[must_use]
pub fn pod_level_limits(pod: &Pod) -> ResourceList {
    parse_list(pod_level(pod).and_then(|r| r.limits.as_ref()))
}

/// Go's `addResourceList`: a resource new to `into` is copied (with its format).
fn add<Q: Amount>(into: &mut BTreeMap<String, Q>, other: &BTreeMap<String, Q>) {
    for (name, q) in other {
        into.entry(name.clone()).and_modify(|e| *e = e.plus(*q)).or_insert(*q);
    }
}

/// Go's `maxResourceList`: the larger quantity replaces the smaller (with its format).
fn max_into<Q: Amount>(into: &mut BTreeMap<String, Q>, other: &BTreeMap<String, Q>) {
    for (name, q) in other {
        let entry = into.entry(name.clone()).or_insert(*q);
        if *q > *entry {
            *entry = *q;
        }
    }
}

/// Which kind of container an aggregation callback is looking at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// A regular container; the list is its own.
    Regular,
    /// An init container; the list is its own plus every earlier sidecar's, which is what
    /// it runs alongside.
    Init,
}

fn spec(pod: &Pod) -> Option<&PodSpec> {
    pod.spec.as_ref()
}

/// The KEP-753 aggregation over all containers, calling `visit` with each container's
/// effective list as upstream's `ContainerFn` sees it.
fn aggregate<Q: Amount>(
    pod: &Pod,
    list_of: impl Fn(&Container) -> BTreeMap<String, Q>,
    mut visit: impl FnMut(&BTreeMap<String, Q>, ContainerKind),
) -> BTreeMap<String, Q> {
    let Some(spec) = spec(pod) else {
        return BTreeMap::new();
    };
    let mut total = BTreeMap::new();
    for c in &spec.containers {
        let list = list_of(c);
        visit(&list, ContainerKind::Regular);
        add(&mut total, &list);
    }
    let mut sidecars = BTreeMap::new();
    let mut init_peak = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let own = list_of(c);
        let effective = if is_restartable_init_container(c) {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut combined = own;
            add(&mut combined, &sidecars);
            combined
        };
        visit(&effective, ContainerKind::Init);
        max_into(&mut init_peak, &effective);
    }
    max_into(&mut total, &init_peak);
    total
}

fn overhead<Q: Amount>(pod: &Pod) -> BTreeMap<String, Q> {
    parse_list_as(spec(pod).and_then(|s| s.overhead.as_ref()))
}

/// Total pod requests (`resourcehelper.PodRequests` with default options): containers per
/// KEP-753, pod-level requests override, plus overhead.
#[must_use]
pub fn pod_requests(pod: &Pod) -> ResourceList {
    pod_requests_as(pod)
}

fn pod_requests_as<Q: Amount>(pod: &Pod) -> BTreeMap<String, Q> {
    let mut requests = aggregate(pod, requests_as, |_, _| {});
    if is_pod_level_requests_set(pod) {
        for (name, q) in parse_list_as::<Q>(pod_level(pod).and_then(|r| r.requests.as_ref())) {
            if is_supported_pod_level_resource(&name) {
                requests.insert(name, q);
            }
        }
    }
    add(&mut requests, &overhead(pod));
    requests
}

/// Total pod limits (`resourcehelper.PodLimits`), calling `visit` for every container's
/// effective limits like upstream's `ContainerFn`; overhead is added to non-zero limits only.
pub fn pod_limits_with(pod: &Pod, visit: impl FnMut(&ResourceList, ContainerKind)) -> ResourceList {
    pod_limits_as(pod, visit)
}

fn pod_limits_as<Q: Amount>(pod: &Pod, visit: impl FnMut(&BTreeMap<String, Q>, ContainerKind)) -> BTreeMap<String, Q> {
    let mut limits = aggregate(pod, limits_as, visit);
    if is_pod_level_resources_set(pod) {
        for (name, q) in parse_list_as::<Q>(pod_level(pod).and_then(|r| r.limits.as_ref())) {
            if is_supported_pod_level_resource(&name) {
                limits.insert(name, q);
            }
        }
    }
    for (name, q) in overhead::<Q>(pod) {
        if let Some(limit) = limits.get_mut(&name)
            && !limit.is_nothing()
        {
            *limit = limit.plus(q);
        }
    }
    limits
}

/// Total pod limits (`resourcehelper.PodLimits`).
#[must_use]
pub fn pod_limits(pod: &Pod) -> ResourceList {
    pod_limits_with(pod, |_, _| {})
}

/// [`pod_requests`] as the API prints it (`status.allocatedResources`): each sum keeps
/// the format of the quantity it started from, as Go's `Add` does.
#[must_use]
pub fn pod_requests_api(pod: &Pod) -> BTreeMap<String, Quantity> {
    printed(pod_requests_as(pod))
}

/// [`pod_limits`] as the API prints it.
#[must_use]
pub fn pod_limits_api(pod: &Pod) -> BTreeMap<String, Quantity> {
    printed(pod_limits_as(pod, |_, _| {}))
}

fn printed(list: BTreeMap<String, quantity::Quantity>) -> BTreeMap<String, Quantity> {
    list.into_iter().map(|(name, q)| (name, Quantity(q.to_string()))).collect()
}

/// Checks that every quantity in the pod parses; the error names the container, the
/// resource and the value.
pub fn validate_pod_resources(pod: &Pod) -> Result<(), InvalidQuantity> {
    let check = |owner: &str, field: &'static str, list: Option<&BTreeMap<String, Quantity>>| {
        for (name, q) in list.into_iter().flatten() {
            quantity::parse(&q.0).map_err(|source| InvalidQuantity {
                owner: owner.to_owned(),
                field,
                resource: name.clone(),
                source,
            })?;
        }
        Ok(())
    };
    let Some(spec) = spec(pod) else { return Ok(()) };
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        let owner = format!("container {:?}", c.name);
        let r = requirements(c);
        check(&owner, "requests", r.and_then(|r| r.requests.as_ref()))?;
        check(&owner, "limits", r.and_then(|r| r.limits.as_ref()))?;
    }
    if let Some(r) = spec.resources.as_ref() {
        check("pod", "requests", r.requests.as_ref())?;
        check("pod", "limits", r.limits.as_ref())?;
    }
    check("pod", "overhead", spec.overhead.as_ref())
}

/// A quantity in a pod spec that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{owner} {field}[{resource}]: {source}")]
pub struct InvalidQuantity {
    /// `container "name"` or `pod`.
    pub owner: String,
    /// `requests`, `limits` or `overhead`.
    pub field: &'static str,
    /// The resource name.
    pub resource: String,
    /// Why it does not parse.
    #[source]
    pub source: quantity::Error,
}

/// Whether `resource` of `container` is served by the pod's extended resource claim
/// (`status.extendedResourceClaimStatus`, `DRAExtendedResource`) rather than by a device
/// plugin or the node's allocatable: upstream's device manager and admission skip such
/// resources, whose devices come from DRA.
#[must_use]
pub fn is_dra_backed_extended_resource(pod: &Pod, container: &str, resource: &str) -> bool {
    pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some_and(|e| {
        e.request_mappings.iter().any(|m| m.container_name == container && m.resource_name == resource)
    })
}

#[cfg(test)]
pub(crate) mod test_pods {
    //! Terse pod builders shared by the cm tests.

    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    pub fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        if pairs.is_empty() {
            return None;
        }
        Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect())
    }

    /// A container with `requests` and `limits`.
    pub fn ctr(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let resources = (!requests.is_empty() || !limits.is_empty()).then(|| ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..ResourceRequirements::default()
        });
        Container { name: name.to_owned(), resources, ..Container::default() }
    }

    /// A sidecar (restartable init container).
    pub fn sidecar(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container { restart_policy: Some("Always".to_owned()), ..ctr(name, requests, limits) }
    }

    pub fn pod(uid: &str, containers: Vec<Container>) -> Pod {
        pod_with_init(uid, Vec::new(), containers)
    }

    pub fn pod_with_init(uid: &str, init: Vec<Container>, containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("pod-{uid}")),
                namespace: Some("default".to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers,
                init_containers: (!init.is_empty()).then_some(init),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    /// Sets pod-level `spec.resources`.
    pub fn with_pod_resources(mut pod: Pod, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
        pod.spec.as_mut().expect("spec").resources = Some(ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..ResourceRequirements::default()
        });
        pod
    }
}

#[cfg(test)]
mod tests {
    use super::test_pods::*;
    use super::*;

    fn milli(list: &ResourceList, name: &str) -> i64 {
        get(list, name).milli_value_saturating()
    }

    #[test]
    fn requests_default_from_limits() {
        let c = ctr("a", &[("cpu", "100m")], &[("cpu", "1"), ("memory", "1Gi")]);
        let r = container_requests(&c);
        assert_eq!(milli(&r, CPU), 100, "an explicit request wins");
        assert_eq!(get(&r, MEMORY).value(), Some(1 << 30), "a missing request takes the limit");
        assert!(!container_raw_requests(&c).contains_key(MEMORY));
    }

    #[test]
    fn regular_containers_add_up() {
        let p = pod("u", vec![ctr("a", &[("cpu", "100m")], &[]), ctr("b", &[("cpu", "250m")], &[])]);
        assert_eq!(milli(&pod_requests(&p), CPU), 350);
    }

    #[test]
    fn init_containers_raise_the_floor() {
        let p = pod_with_init(
            "u",
            vec![ctr("init", &[("cpu", "2")], &[])],
            vec![ctr("a", &[("cpu", "100m")], &[]), ctr("b", &[("cpu", "250m")], &[])],
        );
        assert_eq!(milli(&pod_requests(&p), CPU), 2000);
    }

    #[test]
    fn sidecars_add_and_stack_under_later_init_containers() {
        // KEP-753 example: sidecar 1 cpu, then init 2 cpu (runs with the sidecar: 3),
        // regular 500m (with the sidecar: 1.5). Peak is 3.
        let p = pod_with_init(
            "u",
            vec![sidecar("s", &[("cpu", "1")], &[]), ctr("init", &[("cpu", "2")], &[])],
            vec![ctr("a", &[("cpu", "500m")], &[])],
        );
        assert_eq!(milli(&pod_requests(&p), CPU), 3000);
        // An init container before the sidecar does not stack with it.
        let p = pod_with_init(
            "u",
            vec![ctr("init", &[("cpu", "2")], &[]), sidecar("s", &[("cpu", "1")], &[])],
            vec![ctr("a", &[("cpu", "500m")], &[])],
        );
        assert_eq!(milli(&pod_requests(&p), CPU), 2000);
    }

    #[test]
    fn pod_level_and_overhead() {
        let mut p = with_pod_resources(
            pod("u", vec![ctr("a", &[("cpu", "100m")], &[])]),
            &[("cpu", "1")],
            &[("memory", "2Gi")],
        );
        p.spec.as_mut().unwrap().overhead = list(&[("cpu", "50m"), ("memory", "10Mi")]);
        let r = pod_requests(&p);
        assert_eq!(milli(&r, CPU), 1050, "pod-level request overrides, overhead adds");
        assert_eq!(get(&r, MEMORY).value(), Some(10 << 20), "overhead alone");
        let l = pod_limits(&p);
        assert_eq!(get(&l, MEMORY).value(), Some((2 << 30) + (10 << 20)));
        assert!(!l.contains_key(CPU), "overhead is not added to absent limits");
    }

    /// `status.allocatedResources` prints each sum as Go's `Add` leaves it: in the format
    /// of the first quantity of the sum, or of the larger one where a maximum is taken.
    #[test]
    fn api_totals_print_as_go_adds_them() {
        let p = pod_with_init(
            "u",
            vec![ctr("init", &[("memory", "1Gi")], &[])],
            vec![
                ctr("a", &[("cpu", "100m"), ("memory", "100Mi")], &[("memory", "100Mi")]),
                ctr("b", &[("cpu", "1"), ("memory", "50Mi")], &[]),
            ],
        );
        let text = |m: &BTreeMap<String, Quantity>, k: &str| m.get(k).map(|q| q.0.clone());
        let r = pod_requests_api(&p);
        assert_eq!((text(&r, CPU), text(&r, MEMORY)), (Some("1100m".into()), Some("1Gi".into())));
        let p = pod("u", vec![ctr("a", &[("cpu", "500m"), ("memory", "20M")], &[]), ctr("b", &[("cpu", "0.5")], &[])]);
        let r = pod_requests_api(&p);
        assert_eq!((text(&r, CPU), text(&r, MEMORY)), (Some("1".into()), Some("20M".into())));
        assert!(pod_requests_api(&pod("u", vec![ctr("a", &[], &[])])).is_empty(), "best effort: nothing");
        let p = with_pod_resources(
            pod("u", vec![ctr("a", &[("cpu", "100m")], &[])]),
            &[("cpu", "250m")],
            &[("memory", "64Mi")],
        );
        assert_eq!(text(&pod_requests_api(&p), CPU).as_deref(), Some("250m"), "pod level overrides");
        assert_eq!(text(&pod_limits_api(&p), MEMORY).as_deref(), Some("64Mi"));
    }

    #[test]
    fn limits_visit_sees_cumulative_sidecar_limits() {
        let p = pod_with_init(
            "u",
            vec![sidecar("s", &[], &[("cpu", "1")]), ctr("init", &[], &[("memory", "1Gi")])],
            vec![ctr("a", &[], &[("cpu", "1"), ("memory", "1Gi")])],
        );
        let mut seen = Vec::new();
        let limits = pod_limits_with(&p, |l, kind| {
            seen.push((kind, get(l, CPU).milli_value_saturating()));
        });
        assert_eq!(
            seen,
            vec![(ContainerKind::Regular, 1000), (ContainerKind::Init, 1000), (ContainerKind::Init, 1000)]
        );
        assert_eq!(milli(&limits, CPU), 2000);
    }

    #[test]
    fn invalid_quantities_are_reported_and_otherwise_ignored() {
        let p = pod("u", vec![ctr("web", &[("cpu", "lots")], &[("memory", "1Gi")])]);
        let err = validate_pod_resources(&p).unwrap_err();
        assert_eq!(err.to_string(), "container \"web\" requests[cpu]: invalid quantity \"lots\": unexpected character");
        assert!(!pod_requests(&p).contains_key(CPU));
        assert!(validate_pod_resources(&pod("u", vec![ctr("a", &[("cpu", "1")], &[])])).is_ok());
    }
}
