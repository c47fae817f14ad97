//! [`ApiStatusManager`]: the status manager of API-server mode (`pkg/kubelet/status`).
//! It keeps the latest status of every pod in memory (for `/pods`) and writes it to the
//! API server in the background: only when it changed since the last successful write,
//! with the pod's UID as a precondition, to the mirror pod for static pods. Once a pod
//! with a `deletionTimestamp` has terminated, it deletes the API object with grace 0 —
//! the kubelet's half of graceful deletion.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{StatusManager, StatusProvider};
use crate::metrics::KubeletMetrics;
use crate::pod_manager::PodManager;
use crate::sources::is_static_pod;

#[derive(Debug)]
enum Msg {
    /// The status to write travels with the message, so a pod removed meanwhile still
    /// gets its final status written.
    Status(String, Box<PodStatus>),
    Finished(Box<Pod>),
    Forget(String),
}

/// Status manager that also writes to the API server.
#[derive(Debug, Clone)]
pub struct ApiStatusManager {
    local: StatusManager,
    tx: mpsc::UnboundedSender<Msg>,
}

/// The background writer; run it with [`StatusWriter::run`].
pub struct StatusWriter {
    client: kube::Client,
    local: StatusManager,
    pods: PodManager,
    rx: mpsc::UnboundedReceiver<Msg>,
    /// For retries: a failed write is queued again after a pause.
    retry: mpsc::UnboundedSender<Msg>,
    metrics: Arc<KubeletMetrics>,
}

impl ApiStatusManager {
    #[must_use]
    pub fn new(client: kube::Client, pods: PodManager, metrics: Arc<KubeletMetrics>) -> (Self, StatusWriter) {
        let local = StatusManager::default();
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { local: local.clone(), tx: tx.clone() }, StatusWriter { client, local, pods, rx, retry: tx, metrics })
    }
}

impl StatusProvider for ApiStatusManager {
    fn get(&self, uid: &str) -> Option<PodStatus> {
        self.local.get(uid)
    }

    fn phase(&self, uid: &str) -> Option<String> {
        self.local.phase(uid)
    }

    fn set(&self, uid: &str, status: PodStatus) {
        let changed = self.local.get(uid).as_ref() != Some(&status);
        self.local.set(uid, status.clone());
        if changed {
            let _ = self.tx.send(Msg::Status(uid.to_string(), Box::new(status)));
        }
    }

    fn remove(&self, uid: &str) {
        self.local.remove(uid);
        let _ = self.tx.send(Msg::Forget(uid.to_string()));
    }

    fn pod_finished(&self, pod: &Pod) {
        let _ = self.tx.send(Msg::Finished(Box::new(pod.clone())));
    }

    fn mirror_created(&self, uid: &str) {
        let _ = self.tx.send(Msg::Forget(uid.to_string()));
        if let Some(status) = self.local.get(uid) {
            let _ = self.tx.send(Msg::Status(uid.to_string(), Box::new(status)));
        }
    }
}

/// The merge patch that sets `status` on the pod with `uid` (a UID precondition: a pod
/// recreated under the same name must not get the old pod's status).
#[must_use]
pub fn status_patch(uid: Option<&str>, status: &PodStatus) -> serde_json::Value {
    let mut p = serde_json::json!({ "status": status });
    if let Some(uid) = uid {
        p["metadata"] = serde_json::json!({ "uid": uid });
    }
    p
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter").finish_non_exhaustive()
    }
}

impl StatusWriter {
    /// Writes statuses until shutdown.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut sent: HashMap<String, PodStatus> = HashMap::new();
        loop {
            let msg = tokio::select! {
                () = shutdown.cancelled() => return,
                m = self.rx.recv() => match m { Some(m) => m, None => return },
            };
            match msg {
                Msg::Status(uid, status) => {
                    // A newer status for the same pod may be queued already; write the latest.
                    let status = self.local.get(&uid).unwrap_or(*status);
                    let Some(pod) = self.pods.get(&uid) else { continue };
                    if sent.get(&uid) == Some(&status) {
                        continue;
                    }
                    let start = std::time::Instant::now();
                    match self.write(&pod, &status).await {
                        Ok(()) => {
                            self.metrics.pod_status_sync_duration.observe(start.elapsed().as_secs_f64());
                            sent.insert(uid, status);
                        }
                        Err(e) => {
                            tracing::warn!(pod = %crate::runtime::manager::pod_full_name(&pod), error = %e, "pod status update failed; retrying");
                            // Retry after a pause; a newer status supersedes this one.
                            let retry = self.retry.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                                let _ = retry.send(Msg::Status(uid, Box::new(status)));
                            });
                        }
                    }
                }
                Msg::Finished(pod) => self.delete_terminated(&pod).await,
                Msg::Forget(uid) => {
                    sent.remove(&uid);
                }
            }
        }
    }

    async fn write(&self, pod: &Pod, status: &PodStatus) -> Result<(), kube::Error> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        // Static pods report through their mirror pod, whose UID differs.
        let uid = if is_static_pod(pod) { None } else { pod.metadata.uid.as_deref() };
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status_patch(uid, status))).await {
            Ok(_) => Ok(()),
            // A static pod's mirror may not exist yet: try again until it does.
            Err(e @ kube::Error::Api(_)) if is_static_pod(pod) => Err(e),
            // An API pod that is gone has no status to write.
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The kubelet's last word on a deleted pod: remove the API object (grace 0).
    async fn delete_terminated(&self, pod: &Pod) {
        if is_static_pod(pod) || pod.metadata.deletion_timestamp.is_none() {
            return;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: pod.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "deleted terminated pod from the API"),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "failed to delete terminated pod"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager() -> (ApiStatusManager, StatusWriter) {
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(KubeletMetrics::new(&mut registry, "node"));
        ApiStatusManager::new(client, PodManager::new(&[]), metrics)
    }

    fn running() -> PodStatus {
        PodStatus { phase: Some("Running".into()), ..PodStatus::default() }
    }

    /// Found on the real control plane: a mirror pod deleted through the API came back
    /// `Pending` for good, because its unchanged status was never written to the new
    /// object. A recreated mirror gets the status again.
    #[tokio::test]
    async fn a_recreated_mirror_pod_gets_the_unchanged_status_again() {
        let (status, mut writer) = manager();
        status.set("static-uid", running());
        assert!(matches!(writer.rx.try_recv(), Ok(Msg::Status(uid, _)) if uid == "static-uid"));
        // Unchanged: nothing to write.
        status.set("static-uid", running());
        assert!(writer.rx.try_recv().is_err());

        status.mirror_created("static-uid");
        assert!(matches!(writer.rx.try_recv(), Ok(Msg::Forget(uid)) if uid == "static-uid"));
        assert!(
            matches!(writer.rx.try_recv(), Ok(Msg::Status(uid, s)) if uid == "static-uid" && *s == running()),
            "the status is written again"
        );
        // A pod the manager has no status for yet: nothing to write.
        status.mirror_created("unknown");
        assert!(matches!(writer.rx.try_recv(), Ok(Msg::Forget(_))));
        assert!(writer.rx.try_recv().is_err());
    }
}
