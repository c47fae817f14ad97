//! Where the DRA manager reads `ResourceClaim`s and wipes `ResourceSlice`s
//! ([`ClaimSource`]: the API server, or a fake), and how a pod names its claims
//! (upstream `dynamic-resource-allocation/resourceclaim`: `Name`, `IsForPod`,
//! `IsReservedForPod`).

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodResourceClaim};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::ClaimError;

/// The API objects the DRA manager reads and deletes.
#[async_trait]
pub trait ClaimSource: Send + Sync + std::fmt::Debug {
    /// The `ResourceClaim` `namespace/name`; `None` when there is none.
    async fn resource_claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String>;

    /// Deletes the `ResourceSlice`s of `node` published by `driver` (every driver when
    /// `None`). Nothing to delete is success.
    async fn delete_resource_slices(&self, driver: Option<&str>, node: &str) -> Result<(), String>;
}

/// The API server, through `client`. Claims are read with a GET each time, as upstream
/// does: prepare runs once per pod start, and a cached claim could miss the reservation
/// the scheduler just made.
#[derive(Clone)]
pub struct KubeClaimSource {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClaimSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaimSource").finish_non_exhaustive()
    }
}

impl KubeClaimSource {
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

/// The field selector of a node's (and optionally one driver's) `ResourceSlice`s
/// (upstream `ResourceSliceSelectorNodeName`, `ResourceSliceSelectorDriver`).
#[must_use]
pub fn slice_selector(driver: Option<&str>, node: &str) -> String {
    match driver {
        Some(d) => format!("spec.driver={d},spec.nodeName={node}"),
        None => format!("spec.nodeName={node}"),
    }
}

#[async_trait]
impl ClaimSource for KubeClaimSource {
    async fn resource_claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| e.to_string())
    }

    async fn delete_resource_slices(&self, driver: Option<&str>, node: &str) -> Result<(), String> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&slice_selector(driver, node));
        match api.delete_collection(&DeleteParams::default(), &lp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Claims kept in memory, and the slice deletions asked for (tests, standalone mode).
#[derive(Debug, Default)]
pub struct FakeClaimSource {
    claims: Mutex<HashMap<(String, String), ResourceClaim>>,
    deletions: Mutex<Vec<(Option<String>, String)>>,
    fail_deletions: Mutex<usize>,
}

impl FakeClaimSource {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces `claim` (by its namespace and name).
    pub fn put(&self, claim: ResourceClaim) {
        let key =
            (claim.metadata.namespace.clone().unwrap_or_default(), claim.metadata.name.clone().unwrap_or_default());
        self.claims.lock().unwrap().insert(key, claim);
    }

    /// Removes `namespace/name`.
    pub fn remove(&self, namespace: &str, name: &str) {
        self.claims.lock().unwrap().remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// The deletions asked for so far: (driver, node).
    #[must_use]
    pub fn deletions(&self) -> Vec<(Option<String>, String)> {
        self.deletions.lock().unwrap().clone()
    }

    /// The next `n` deletions fail (they are still recorded).
    pub fn fail_next_deletions(&self, n: usize) {
        *self.fail_deletions.lock().unwrap() = n;
    }
}

#[async_trait]
impl ClaimSource for FakeClaimSource {
    async fn resource_claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        Ok(self.claims.lock().unwrap().get(&(namespace.to_owned(), name.to_owned())).cloned())
    }

    async fn delete_resource_slices(&self, driver: Option<&str>, node: &str) -> Result<(), String> {
        self.deletions.lock().unwrap().push((driver.map(str::to_owned), node.to_owned()));
        let mut failing = self.fail_deletions.lock().unwrap();
        if *failing > 0 {
            *failing -= 1;
            return Err("the API server is not reachable".into());
        }
        Ok(())
    }
}

/// `namespace/name` of a pod, for messages.
pub(super) fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The name of the `ResourceClaim` behind a pod's claim (upstream `resourceclaim.Name`),
/// and whether the claim must be owned by the pod (it was made from a template). `None`:
/// no claim was needed (the claim controller decided so for a template).
///
/// # Errors
/// The template's claim is not in the pod status yet, or the entry names neither a claim
/// nor a template.
pub fn claim_name(pod: &Pod, pod_claim: &PodResourceClaim) -> Result<Option<(String, bool)>, ClaimError> {
    if let Some(name) = &pod_claim.resource_claim_name {
        return Ok(Some((name.clone(), false)));
    }
    if pod_claim.resource_claim_template_name.is_some() {
        let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
        return match statuses.into_iter().flatten().find(|s| s.name == pod_claim.name) {
            Some(s) => Ok(s.resource_claim_name.clone().map(|n| (n, true))),
            None => Err(ClaimError::NotCreatedYet { pod: pod_ref(pod) }),
        };
    }
    Err(ClaimError::Unsupported { pod: pod_ref(pod), claim: pod_claim.name.clone() })
}

/// The pod's claims: `spec.resourceClaims`, then the claim the scheduler made for its
/// extended resources backed by DRA (`status.extendedResourceClaimStatus`, GA in 1.37).
pub(super) fn pod_claims(pod: &Pod) -> Vec<PodResourceClaim> {
    let mut claims: Vec<PodResourceClaim> =
        pod.spec.as_ref().and_then(|s| s.resource_claims.clone()).unwrap_or_default();
    if let Some(ext) = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()) {
        claims.push(PodResourceClaim {
            resource_claim_name: Some(ext.resource_claim_name.clone()),
            ..PodResourceClaim::default()
        });
    }
    claims
}

/// Upstream `resourceclaim.IsForPod`: a claim made from a template must live in the pod's
/// namespace and be controlled by the pod.
///
/// # Errors
/// Upstream's messages.
pub fn is_for_pod(pod: &Pod, claim: &ResourceClaim) -> Result<(), ClaimError> {
    let claim_ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    let claim_ref = format!("{claim_ns}/{}", claim.metadata.name.as_deref().unwrap_or_default());
    if claim_ns != pod.metadata.namespace.as_deref().unwrap_or_default() {
        return Err(ClaimError::OtherNamespace { claim: claim_ref, pod: pod_ref(pod) });
    }
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let controlled =
        claim.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.uid == pod_uid);
    if !controlled {
        return Err(ClaimError::NotOwner { claim: claim_ref, pod: pod_ref(pod) });
    }
    Ok(())
}

/// Upstream `resourceclaim.IsReservedForPod` (without pod groups: beta
/// `DRAWorkloadResourceClaims` is off by default).
#[must_use]
pub fn is_reserved_for_pod(pod: &Pod, claim: &ResourceClaim) -> bool {
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    claim.status.as_ref().and_then(|s| s.reserved_for.as_ref()).into_iter().flatten().any(|r| r.uid == pod_uid)
}

pub use crate::types::pod_resources::is_dra_backed_extended_resource;
pub use crate::types::resource_names::{DEVICE_CLASS_RESOURCE_PREFIX, is_dra_extended_resource_name};

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn claim_names_come_from_the_spec_or_the_status() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "t"},
                {"name": "c", "resourceClaimTemplateName": "t"},
                {"name": "d", "resourceClaimTemplateName": "t"},
                {"name": "e"}
            ]},
            "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}, {"name": "c"}]}
        }));
        let claims = pod_claims(&p);
        assert_eq!(claim_name(&p, &claims[0]).unwrap(), Some(("shared".into(), false)));
        assert_eq!(claim_name(&p, &claims[1]).unwrap(), Some(("p-b-x1".into(), true)));
        assert_eq!(claim_name(&p, &claims[2]).unwrap(), None);
        assert_eq!(claim_name(&p, &claims[3]).unwrap_err().to_string(), "pod \"ns/p\": ResourceClaim not created yet");
        assert_eq!(
            claim_name(&p, &claims[4]).unwrap_err().to_string(),
            "pod \"ns/p\", spec.resourceClaim \"e\": none of the supported fields are set"
        );
    }

    #[test]
    fn a_template_claim_must_be_the_pods() {
        let p = pod(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}));
        let claim = |ns: &str, owner: &str| -> ResourceClaim {
            serde_json::from_value(json!({"metadata": {"name": "c", "namespace": ns, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner, "controller": true}
            ]}}))
            .unwrap()
        };
        assert!(is_for_pod(&p, &claim("ns", "u")).is_ok());
        assert_eq!(
            is_for_pod(&p, &claim("ns", "other")).unwrap_err().to_string(),
            "ResourceClaim ns/c was not created for Pod ns/p (Pod is not owner)"
        );
        assert_eq!(
            is_for_pod(&p, &claim("other", "u")).unwrap_err().to_string(),
            "ResourceClaim other/c is not in the same namespace as Pod ns/p"
        );
    }

    #[test]
    fn the_extended_resource_claim_counts_as_a_pod_claim() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": []},
            "status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-x", "requestMappings": [
                {"containerName": "c", "resourceName": "example.com/gpu", "requestName": "container-0-request-0"}
            ]}}
        }));
        let claims = pod_claims(&p);
        assert_eq!(claim_name(&p, &claims[0]).unwrap(), Some(("p-extended-resources-x".into(), false)));
        assert!(is_dra_backed_extended_resource(&p, "c", "example.com/gpu"));
        assert!(!is_dra_backed_extended_resource(&p, "other", "example.com/gpu"));
        assert!(is_dra_extended_resource_name("deviceclass.resource.kubernetes.io/gpu"));
        assert!(is_dra_extended_resource_name("example.com/gpu"));
        assert!(!is_dra_extended_resource_name("cpu"));
    }

    #[test]
    fn slice_selectors() {
        assert_eq!(slice_selector(Some("d.example.com"), "n1"), "spec.driver=d.example.com,spec.nodeName=n1");
        assert_eq!(slice_selector(None, "n1"), "spec.nodeName=n1");
    }
}
