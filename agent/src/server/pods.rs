//! `/pods`: the pods bound to this node as the agent sees them, as a `v1` `PodList`
//! (the shape of the upstream kubelet's `/pods`).

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

/// Where `/pods` gets its pods (the pod manager, in the agent).
pub trait PodsProvider: Send + Sync {
    /// The pods to list, in the order to list them.
    fn pods(&self) -> Vec<Pod>;
}

/// A provider that returns the pods it was last given.
#[derive(Debug, Default)]
pub struct FakePods {
    pods: Mutex<Vec<Pod>>,
}

impl FakePods {
    /// A provider listing `pods`.
    #[must_use]
    pub fn new(pods: Vec<Pod>) -> Self {
        Self { pods: Mutex::new(pods) }
    }

    /// Replaces the listed pods.
    pub fn set(&self, pods: Vec<Pod>) {
        *self.pods.lock().expect("fake pods lock") = pods;
    }
}

impl PodsProvider for FakePods {
    fn pods(&self) -> Vec<Pod> {
        self.pods.lock().expect("fake pods lock").clone()
    }
}

/// `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[...]}`, fields in that order
/// (also `/runningpods/`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodList {
    kind: &'static str,
    api_version: &'static str,
    metadata: EmptyListMeta,
    items: Vec<Pod>,
}

impl PodList {
    /// A `v1` `PodList` of `items`.
    pub(crate) fn v1(items: Vec<Pod>) -> Self {
        Self { kind: "PodList", api_version: "v1", metadata: EmptyListMeta {}, items }
    }
}

#[derive(Serialize)]
struct EmptyListMeta {}

pub(crate) async fn list_pods(State(provider): State<Arc<dyn PodsProvider>>) -> Response {
    Json(PodList::v1(provider.pods())).into_response()
}
