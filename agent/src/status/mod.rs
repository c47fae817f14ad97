//! Pod status: what the kubelet reports for a pod (`generateAPIPodStatus`, `getPhase`,
//! and the condition generators of `pkg/kubelet/status`), and the [`StatusManager`]
//! that keeps the latest status of every pod for `/pods` (and, in API mode, for the
//! API server).

pub mod api;
pub mod generate;
pub mod metrics;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodStatus};

pub use generate::{StatusInputs, generate_api_pod_status, get_phase};

/// Holds the latest generated status of every pod, by UID.
pub trait StatusProvider: Send + Sync + std::fmt::Debug {
    fn get(&self, uid: &str) -> Option<PodStatus>;
    /// The pod's phase alone: housekeeping asks this of every pod every 2 s, and a whole
    /// status is not cheap to copy.
    fn phase(&self, uid: &str) -> Option<String> {
        self.get(uid).and_then(|s| s.phase)
    }
    fn set(&self, uid: &str, status: PodStatus);
    fn remove(&self, uid: &str);
    /// A pod's worker finished (the pod is terminated and its runtime objects removed).
    /// The API-server status manager deletes a gracefully deleted pod's object here.
    fn pod_finished(&self, pod: &Pod) {
        let _ = pod;
    }
    /// The mirror pod of static pod `uid` was (re)created. A new mirror starts with no
    /// status, so the API-server status manager writes the pod's status to it again even
    /// though the status itself did not change (upstream notices it by reconciling the
    /// API's status with its own).
    fn mirror_created(&self, uid: &str) {
        let _ = uid;
    }
}

/// In-memory status manager (standalone mode keeps statuses only in memory, as the
/// kubelet does: they are recomputed from the runtime after a restart).
#[derive(Debug, Default, Clone)]
pub struct StatusManager {
    inner: Arc<RwLock<HashMap<String, PodStatus>>>,
}

impl StatusProvider for StatusManager {
    fn get(&self, uid: &str) -> Option<PodStatus> {
        self.inner.read().unwrap().get(uid).cloned()
    }

    fn phase(&self, uid: &str) -> Option<String> {
        self.inner.read().unwrap().get(uid).and_then(|s| s.phase.clone())
    }

    fn set(&self, uid: &str, status: PodStatus) {
        self.inner.write().unwrap().insert(uid.to_string(), status);
    }

    fn remove(&self, uid: &str) {
        self.inner.write().unwrap().remove(uid);
    }
}
