//! Mirror pods (`pkg/kubelet/pod/mirror_client.go`): in API-server mode every static pod
//! has a read-only copy in the API, so the cluster sees it. Created when missing,
//! recreated when deleted or when it belongs to an older version of the manifest
//! (its `kubernetes.io/config.mirror` annotation is the static pod's hash), deleted when
//! the manifest goes. Reconciled every housekeeping period. A mirror made anew has no
//! status: the status manager is told to write the static pod's status to it again.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams};
use tokio_util::sync::CancellationToken;

use crate::pod_manager::PodManager;
use crate::status::StatusProvider;
use crate::types::pod::{CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, CONFIG_SEEN_ANNOTATION, is_static_pod};

/// Mirror pods the API has for this node, by `namespace/name` (filled by the pod watch).
pub type MirrorStore = Arc<RwLock<BTreeMap<String, Pod>>>;

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The mirror pod of a static pod.
#[must_use]
pub fn mirror_of(static_pod: &Pod, node: Option<&Node>) -> Pod {
    let hash = static_pod.metadata.uid.clone().unwrap_or_default();
    let mut annotations = static_pod.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(CONFIG_SEEN_ANNOTATION);
    annotations.insert(CONFIG_MIRROR_ANNOTATION.into(), hash.clone());
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), hash);
    let owner = node.and_then(|n| {
        Some(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: n.metadata.name.clone()?,
            uid: n.metadata.uid.clone()?,
            controller: Some(true),
            ..Default::default()
        })
    });
    Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: static_pod.metadata.namespace.clone(),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: static_pod.spec.clone(),
        status: None,
    }
}

/// One reconciliation; returns how many API calls it made.
pub async fn reconcile(
    client: &kube::Client,
    pods: &PodManager,
    mirrors: &MirrorStore,
    node: Option<&Node>,
    status: &dyn StatusProvider,
) -> usize {
    let statics: BTreeMap<String, Pod> =
        pods.pods().into_iter().filter(|p| is_static_pod(p)).map(|p| (key(&p), Arc::unwrap_or_clone(p))).collect();
    let existing = mirrors.read().unwrap().clone();
    let mut calls = 0;
    for (k, sp) in &statics {
        let want_hash = sp.metadata.uid.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), sp.metadata.namespace.as_deref().unwrap_or("default"));
        match existing.get(k) {
            Some(m) if m.metadata.deletion_timestamp.is_some() => {}
            Some(m)
                if m.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_MIRROR_ANNOTATION))
                    == Some(&want_hash) => {}
            Some(m) => {
                calls += 1;
                tracing::info!(pod = %k, "mirror pod is outdated; deleting it");
                let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
                if let Err(e) = api.delete(m.metadata.name.as_deref().unwrap_or_default(), &dp).await {
                    tracing::warn!(pod = %k, error = %e, "failed to delete outdated mirror pod");
                }
            }
            None => {
                calls += 1;
                match api.create(&PostParams::default(), &mirror_of(sp, node)).await {
                    Ok(_) => {
                        tracing::info!(pod = %k, "created mirror pod");
                        status.mirror_created(&want_hash);
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => tracing::warn!(pod = %k, error = %e, "failed to create mirror pod"),
                }
            }
        }
    }
    for (k, m) in &existing {
        if statics.contains_key(k) || m.metadata.deletion_timestamp.is_some() {
            continue;
        }
        calls += 1;
        let api: Api<Pod> = Api::namespaced(client.clone(), m.metadata.namespace.as_deref().unwrap_or("default"));
        let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        match api.delete(m.metadata.name.as_deref().unwrap_or_default(), &dp).await {
            Ok(_) => tracing::info!(pod = %k, "deleted mirror pod of a removed static pod"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(pod = %k, error = %e, "failed to delete mirror pod"),
        }
    }
    calls
}

/// Reconciles every `period` until shutdown (after the pod watch has listed once).
pub async fn run(
    client: kube::Client,
    pods: PodManager,
    mirrors: MirrorStore,
    node: Arc<RwLock<Option<Node>>>,
    status: Arc<dyn StatusProvider>,
    period: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        if !pods.sources_ready() {
            continue;
        }
        let n = node.read().unwrap().clone();
        reconcile(&client, &pods, &mirrors, n.as_ref(), status.as_ref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_copies_spec_and_marks_hash_and_owner() {
        let sp: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-n1", "namespace": "default", "uid": "abc",
                         "annotations": {"kubernetes.io/config.source": "file", "kubernetes.io/config.seen": "x"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1", "uid": "nuid"}})).unwrap();
        let m = mirror_of(&sp, Some(&node));
        let ann = m.metadata.annotations.unwrap();
        assert_eq!(ann[CONFIG_MIRROR_ANNOTATION], "abc");
        assert!(!ann.contains_key(CONFIG_SEEN_ANNOTATION));
        assert_eq!(m.metadata.owner_references.unwrap()[0].uid, "nuid");
        assert_eq!(m.spec, sp.spec);
        assert!(m.metadata.uid.is_none());
    }
}
