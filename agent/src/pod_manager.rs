//! The pod manager (`pkg/kubelet/pod`): the desired pods by UID, merged from every
//! source's snapshots. Diffing a snapshot against what the source sent before yields
//! the adds, updates and removals the sync loop hands to the pod workers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::types::pod::CONFIG_SEEN_ANNOTATION;
use crate::types::pod::PodUpdate;

/// What a snapshot changed.
#[derive(Debug, Default)]
pub struct PodChanges {
    pub added: Vec<Pod>,
    pub updated: Vec<Pod>,
    pub removed: Vec<Pod>,
    /// Pods whose spec is the same but whose readiness gates' conditions changed in the
    /// API: their Ready condition needs a sync (upstream `HandlePodReconcile` on
    /// `NeedToReconcilePodReadiness`).
    pub reconcile: Vec<Pod>,
}

/// The status and message of the conditions `pod`'s readiness gates name, in gate order
/// (`None` for a gate without its condition).
fn gate_conditions(pod: &Pod) -> Vec<Option<(String, Option<String>)>> {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|gate| {
            conditions.iter().find(|c| c.type_ == gate.condition_type).map(|c| (c.status.clone(), c.message.clone()))
        })
        .collect()
}

#[derive(Debug, Default)]
struct Inner {
    /// Shared: readers of every pod (stats, eviction, housekeeping, every few seconds)
    /// take references, not copies of hundreds of pods.
    pods: BTreeMap<String, Arc<Pod>>,
    /// The pod each source last handed over, by UID: a snapshot's pod that is the very
    /// same `Arc` did not change and is skipped (see [`PodUpdate`]). Its keys are always
    /// keys of `pods` too: both gain and lose a UID together.
    from_source: HashMap<String, Arc<Pod>>,
    by_source: HashMap<&'static str, BTreeSet<String>>,
    ready_sources: BTreeSet<&'static str>,
    /// Sources whose first snapshot the sync loop has finished handling.
    handled_sources: BTreeSet<&'static str>,
}

/// Desired pods; cheap to clone (shared).
#[derive(Debug, Default, Clone)]
pub struct PodManager {
    inner: Arc<RwLock<Inner>>,
    expected_sources: Arc<BTreeSet<&'static str>>,
}

fn same_spec(a: &Pod, b: &Pod) -> bool {
    a.spec == b.spec
        && a.metadata.labels == b.metadata.labels
        && {
            let strip = |p: &Pod| {
                let mut a = p.metadata.annotations.clone().unwrap_or_default();
                a.remove(CONFIG_SEEN_ANNOTATION);
                a
            };
            strip(a) == strip(b)
        }
        && a.metadata.deletion_timestamp == b.metadata.deletion_timestamp
}

impl PodManager {
    /// A manager that is "ready" once each of `sources` has sent its first snapshot.
    #[must_use]
    pub fn new(sources: &[&'static str]) -> Self {
        Self { inner: Arc::default(), expected_sources: Arc::new(sources.iter().copied().collect()) }
    }

    /// Applies a source snapshot and returns what changed.
    pub fn apply(&self, update: PodUpdate) -> PodChanges {
        let PodUpdate::Set { source, pods } = update;
        let mut inner = self.inner.write().unwrap();
        inner.ready_sources.insert(source);
        let mut changes = PodChanges::default();
        let new_uids: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let old_uids = inner.by_source.remove(source).unwrap_or_default();
        for uid in old_uids.difference(&new_uids) {
            inner.from_source.remove(uid);
            if let Some(p) = inner.pods.remove(uid) {
                changes.removed.push(Arc::unwrap_or_clone(p));
            }
        }
        inner.by_source.insert(source, new_uids);
        for shared in pods {
            let Some(uid) = shared.metadata.uid.as_deref() else { continue };
            if inner.from_source.get(uid).is_some_and(|last| Arc::ptr_eq(last, &shared)) {
                continue;
            }
            let uid = uid.to_owned();
            inner.from_source.insert(uid.clone(), shared.clone());
            let mut pod = Arc::unwrap_or_clone(shared);
            match inner.pods.get_mut(&uid) {
                // The status as the API server has it (another writer's changes included:
                // the node lifecycle controller marks pods not ready), for the status
                // manager's reconciliation, as upstream's pod config keeps it.
                Some(existing) if same_spec(existing, &pod) => {
                    let gates = gate_conditions(&pod);
                    if !gates.is_empty() && gates != gate_conditions(existing) {
                        changes.reconcile.push(pod.clone());
                    }
                    let existing = Arc::make_mut(existing);
                    existing.status = pod.status;
                    // Which write this status is from (the status writer's reconciliation
                    // tells a late copy from another writer's change by it).
                    existing.metadata.resource_version = pod.metadata.resource_version;
                }
                Some(existing) => {
                    let seen =
                        existing.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SEEN_ANNOTATION)).cloned();
                    if let Some(seen) = seen {
                        pod.metadata
                            .annotations
                            .get_or_insert_with(BTreeMap::new)
                            .insert(CONFIG_SEEN_ANNOTATION.into(), seen);
                    }
                    inner.pods.insert(uid, Arc::new(pod.clone()));
                    changes.updated.push(pod);
                }
                None => {
                    pod.metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(CONFIG_SEEN_ANNOTATION.into(), Timestamp::now().to_string());
                    inner.pods.insert(uid, Arc::new(pod.clone()));
                    changes.added.push(pod);
                }
            }
        }
        changes
    }

    /// Whether every expected source has sent its first snapshot (upstream
    /// `sourcesReady`): until then, housekeeping must not kill pods it does not know.
    #[must_use]
    pub fn sources_ready(&self) -> bool {
        let inner = self.inner.read().unwrap();
        self.expected_sources.iter().all(|s| inner.ready_sources.contains(s))
    }

    /// The sync loop has handled every snapshot applied so far (upstream marks a source
    /// in the kubelet's `sourcesReady` after `HandlePodAdditions`, not before).
    pub fn mark_handled(&self) {
        let mut inner = self.inner.write().unwrap();
        let ready = inner.ready_sources.clone();
        inner.handled_sources.extend(ready);
    }

    /// Whether the first snapshot of every expected source has been handled (upstream's
    /// kubelet `sourcesReady.AllReady()`): while the first one is being admitted, the
    /// resource managers must not take a pod that is not admitted yet for a gone one and
    /// release what it holds (after an agent restart, pods are admitted again one by one).
    #[must_use]
    pub fn sources_handled(&self) -> bool {
        let inner = self.inner.read().unwrap();
        self.expected_sources.iter().all(|s| inner.handled_sources.contains(s))
    }

    /// The desired pod `uid`, shared (not copied).
    #[must_use]
    pub fn shared(&self, uid: &str) -> Option<Arc<Pod>> {
        self.inner.read().unwrap().pods.get(uid).cloned()
    }

    #[must_use]
    pub fn get(&self, uid: &str) -> Option<Pod> {
        self.inner.read().unwrap().pods.get(uid).map(|p| Pod::clone(p))
    }

    /// The namespace and name of the desired pod `uid` (no pod is copied).
    #[must_use]
    pub fn namespace_and_name(&self, uid: &str) -> Option<(String, String)> {
        let inner = self.inner.read().unwrap();
        let pod = inner.pods.get(uid)?;
        Some((pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default()))
    }

    /// All desired pods, ordered by UID (shared, not copied).
    #[must_use]
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.inner.read().unwrap().pods.values().cloned().collect()
    }

    /// The UIDs of all desired pods (no pod is copied).
    #[must_use]
    pub fn uids(&self) -> std::collections::HashSet<String> {
        self.inner.read().unwrap().pods.keys().cloned().collect()
    }

    /// Whether the desired pod `uid` is a static pod (from a file or URL source).
    #[must_use]
    pub fn is_static(&self, uid: &str) -> bool {
        self.inner.read().unwrap().pods.get(uid).is_some_and(|p| crate::types::pod::is_static_pod(p))
    }

    /// How many pods are desired, and how many of them are static.
    #[must_use]
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.inner.read().unwrap();
        (inner.pods.len(), inner.pods.values().filter(|p| crate::types::pod::is_static_pod(p)).count())
    }

    /// How many ephemeral containers the desired pods' specs have (upstream's pod manager
    /// keeps `kubelet_managed_ephemeral_containers` so as pods are added, updated and
    /// removed).
    #[must_use]
    pub fn ephemeral_containers(&self) -> usize {
        let inner = self.inner.read().unwrap();
        inner.pods.values().filter_map(|p| p.spec.as_ref()?.ephemeral_containers.as_ref()).map(Vec::len).sum()
    }

    #[must_use]
    pub fn contains(&self, uid: &str) -> bool {
        self.inner.read().unwrap().pods.contains_key(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(uid: &str, image: &str) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                uid: Some(uid.into()),
                name: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "c".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn uids_and_counts_without_copying_pods() {
        let m = PodManager::new(&["api", "file"]);
        let mut static_pod = pod("s", "x");
        static_pod.metadata.annotations =
            Some(BTreeMap::from([(crate::types::pod::CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned())]));
        m.apply(PodUpdate::set("file", [static_pod]));
        m.apply(PodUpdate::set("api", [pod("a", "x"), pod("b", "x")]));
        assert_eq!(m.uids(), ["a", "b", "s"].map(String::from).into_iter().collect());
        assert!(m.is_static("s"));
        assert!(!m.is_static("a"));
        assert_eq!(m.namespace_and_name("a"), Some((String::new(), "a".into())));
        assert_eq!(m.namespace_and_name("z"), None);
        assert!(!m.is_static("gone"));
        assert_eq!(m.counts(), (3, 1));
    }

    #[test]
    fn counts_ephemeral_containers_as_pods_come_and_go() {
        let m = PodManager::new(&["api"]);
        let with_debuggers = |uid: &str, n: usize| {
            let mut p = pod(uid, "x");
            let names: Vec<_> =
                (0..n).map(|i| serde_json::json!({"name": format!("debug-{i}"), "image": "b"})).collect();
            p.spec.as_mut().unwrap().ephemeral_containers = Some(serde_json::from_value(names.into()).unwrap());
            p
        };
        assert_eq!(m.ephemeral_containers(), 0);
        m.apply(PodUpdate::set("api", [with_debuggers("a", 1), pod("b", "x")]));
        assert_eq!(m.ephemeral_containers(), 1);
        m.apply(PodUpdate::set("api", [with_debuggers("a", 2), with_debuggers("b", 1)]));
        assert_eq!(m.ephemeral_containers(), 3);
        m.apply(PodUpdate::set("api", [with_debuggers("b", 1)]));
        assert_eq!(m.ephemeral_containers(), 1);
    }

    /// A status-only update asks for a sync when the condition of one of the pod's
    /// readiness gates changed, and only then.
    #[test]
    fn a_changed_readiness_gate_condition_asks_for_a_sync() {
        let m = PodManager::new(&["api"]);
        let gated = |gate_status: Option<&str>, ready: &str| {
            let mut p = pod("g", "x");
            p.spec.as_mut().unwrap().readiness_gates =
                Some(vec![k8s_openapi::api::core::v1::PodReadinessGate { condition_type: "example.com/gate".into() }]);
            let mut conditions = vec![serde_json::json!({"type": "Ready", "status": ready})];
            if let Some(status) = gate_status {
                conditions.push(serde_json::json!({"type": "example.com/gate", "status": status}));
            }
            p.status = Some(serde_json::from_value(serde_json::json!({"conditions": conditions})).unwrap());
            p
        };
        let apply = |p: Pod, plain: Pod| m.apply(PodUpdate::set("api", [p, plain]));
        assert!(apply(gated(None, "False"), pod("plain", "x")).reconcile.is_empty(), "added, not reconciled");
        let mut plain = pod("plain", "x");
        plain.status = Some(serde_json::from_value(serde_json::json!({"phase": "Running"})).unwrap());
        assert!(apply(gated(None, "True"), plain.clone()).reconcile.is_empty(), "the kubelet's own condition changed");
        let changes = apply(gated(Some("True"), "True"), plain.clone());
        assert_eq!(changes.reconcile.iter().map(|p| p.metadata.uid.as_deref()).collect::<Vec<_>>(), [Some("g")]);
        assert!(changes.updated.is_empty());
        assert!(apply(gated(Some("True"), "False"), plain.clone()).reconcile.is_empty());
        assert_eq!(apply(gated(Some("False"), "False"), plain).reconcile.len(), 1);
    }

    /// A pod the source hands over unchanged (the same `Arc`) is neither compared nor
    /// copied: a status-only change of one pod leaves every other pod's shared copy as
    /// it was, even while readers hold it.
    #[test]
    fn unchanged_pods_of_a_snapshot_are_skipped_not_copied() {
        let m = PodManager::new(&["api"]);
        let a = Arc::new(pod("a", "x"));
        let b = Arc::new(pod("b", "x"));
        let c = m.apply(PodUpdate::Set { source: "api", pods: vec![a.clone(), b.clone()] });
        assert_eq!(c.added.len(), 2);
        let held = m.pods();
        let mut running = pod("b", "x");
        running.status = Some(serde_json::from_value(serde_json::json!({"phase": "Running"})).unwrap());
        let c = m.apply(PodUpdate::Set { source: "api", pods: vec![a.clone(), Arc::new(running)] });
        assert!(c.added.is_empty() && c.updated.is_empty() && c.removed.is_empty());
        let now = m.pods();
        assert!(Arc::ptr_eq(&held[0], &now[0]), "pod a was copied although unchanged");
        assert_eq!(now[1].status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        // Removed and handed over again (the same Arc): it is added again.
        m.apply(PodUpdate::Set { source: "api", pods: vec![] });
        let c = m.apply(PodUpdate::Set { source: "api", pods: vec![a] });
        assert_eq!(c.added.len(), 1);
    }

    #[test]
    fn diffs_snapshots() {
        let m = PodManager::new(&["file"]);
        assert!(!m.sources_ready());
        let c = m.apply(PodUpdate::set("file", [pod("a", "x"), pod("b", "x")]));
        assert!(m.sources_ready());
        assert_eq!(c.added.len(), 2);
        assert!(c.added[0].metadata.annotations.as_ref().unwrap().contains_key(CONFIG_SEEN_ANNOTATION));
        let c = m.apply(PodUpdate::set("file", [pod("a", "x"), pod("b", "y")]));
        assert_eq!((c.added.len(), c.updated.len(), c.removed.len()), (0, 1, 0));
        let c = m.apply(PodUpdate::set("file", [pod("b", "y")]));
        assert_eq!(c.removed[0].metadata.uid.as_deref(), Some("a"));
        assert_eq!(m.pods().len(), 1);
        let c = m.apply(PodUpdate::set("file", [pod("b", "y")]));
        assert!(c.added.is_empty() && c.updated.is_empty() && c.removed.is_empty());
    }
}
