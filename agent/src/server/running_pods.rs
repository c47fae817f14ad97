//! `/runningpods/`: the pods as the container runtime sees them, as a `v1` `PodList`
//! (upstream `getRunningPods`, "used for testing only"), unlike `/pods`, which lists the
//! pods the agent wants to run.
//!
//! Upstream lists the runtime cache (`GetPods(all=false)`: the ready sandboxes and the
//! running containers, grouped by pod) and converts each pod with `Pod.ToAPIPod`, which
//! keeps only the pod's UID, name and namespace and each container's name and image (the
//! image as the runtime lists it, for containerd the reference the container was created
//! from). Here the runtime is asked on every request (upstream's cache is at most 2 s
//! old): `ListPodSandbox` with state `SANDBOX_READY` and `ListContainers` with state
//! `CONTAINER_RUNNING`. A pod is listed if it has either.
//!
//! As upstream, a sandbox names its pod by its CRI metadata (sandboxes without metadata
//! are skipped) and a container by the `io.kubernetes.pod.*` labels; a container with no
//! CRI metadata is skipped. Deviation: containers without the pod UID label (not made by
//! a kubelet) are skipped rather than grouped under an empty pod UID. Pods are ordered by
//! namespace, name and UID, containers by creation (upstream: Go map order). A runtime
//! error is a 500 with the error's text, as upstream.
//!
//! The route exists only with `enableDebuggingHandlers` (upstream installs it with the
//! other auth-required handlers); otherwise, and always on the read-only port, it is 405.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::pods::PodList;
use super::streaming::text;
use crate::container::labels::PodRef;
use crate::container::{RuntimeService, api};

/// The running pods of `sandboxes` (ready ones) and `containers` (running ones), as
/// upstream's `ToAPIPod` makes them (see the module docs). The listings are filtered by
/// state here too, so a runtime that ignores the filters still gives the right answer.
#[must_use]
pub fn to_api_pods(sandboxes: &[api::PodSandbox], containers: &[api::Container]) -> Vec<Pod> {
    let mut pods: BTreeMap<String, Grouped> = BTreeMap::new();
    for sandbox in sandboxes.iter().filter(|s| s.state == api::PodSandboxState::SandboxReady as i32) {
        if let Some(m) = &sandbox.metadata {
            pods.entry(m.uid.clone()).or_insert_with(|| Grouped::new(&m.namespace, &m.name));
        }
    }
    for container in containers.iter().filter(|c| c.state == api::ContainerState::ContainerRunning as i32) {
        let (Some(meta), Some(pod)) = (&container.metadata, PodRef::from_labels(&container.labels)) else {
            continue;
        };
        let image = container.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        pods.entry(pod.uid).or_insert_with(|| Grouped::new(&pod.namespace, &pod.name)).containers.push((
            container.created_at,
            meta.name.clone(),
            image,
        ));
    }
    let mut pods: Vec<_> = pods.into_iter().collect();
    pods.sort_by(|(uid_a, a), (uid_b, b)| (&a.namespace, &a.name, uid_a).cmp(&(&b.namespace, &b.name, uid_b)));
    pods.into_iter()
        .map(|(uid, Grouped { namespace, name, mut containers })| {
            containers.sort();
            let containers = containers
                .into_iter()
                .map(|(_, name, image)| Container {
                    name,
                    image: (!image.is_empty()).then_some(image),
                    ..Container::default()
                })
                .collect();
            Pod {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(namespace),
                    uid: Some(uid),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec { containers, ..PodSpec::default() }),
                status: None,
            }
        })
        .collect()
}

/// One pod of the listing while it is grouped.
struct Grouped {
    namespace: String,
    name: String,
    /// (created at, name, image).
    containers: Vec<(i64, String, String)>,
}

impl Grouped {
    fn new(namespace: &str, name: &str) -> Self {
        Self { namespace: namespace.to_owned(), name: name.to_owned(), containers: Vec::new() }
    }
}

/// The running pods of `runtime` (see the module docs).
pub async fn running_pods(runtime: &dyn RuntimeService) -> crate::container::Result<Vec<Pod>> {
    let ready = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
        ..Default::default()
    };
    let running = api::ContainerFilter {
        state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
        ..Default::default()
    };
    let sandboxes = runtime.list_pod_sandbox(Some(ready)).await?;
    let containers = runtime.list_containers(Some(running)).await?;
    Ok(to_api_pods(&sandboxes, &containers))
}

pub(crate) async fn list_running_pods(State(runtime): State<Arc<dyn RuntimeService>>) -> Response {
    match running_pods(runtime.as_ref()).await {
        Ok(items) => Json(PodList::v1(items)).into_response(),
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::labels;

    fn sandbox(id: &str, uid: &str, name: &str, ready: bool) -> api::PodSandbox {
        api::PodSandbox {
            id: id.to_owned(),
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_owned(),
                namespace: "default".to_owned(),
                uid: uid.to_owned(),
                attempt: 0,
            }),
            state: if ready { api::PodSandboxState::SandboxReady } else { api::PodSandboxState::SandboxNotready }
                as i32,
            ..Default::default()
        }
    }

    fn container(uid: &str, pod: &str, name: &str, state: api::ContainerState, created_at: i64) -> api::Container {
        api::Container {
            id: format!("{pod}-{name}"),
            metadata: Some(api::ContainerMetadata { name: name.to_owned(), attempt: 0 }),
            image: Some(api::ImageSpec { image: format!("{name}:1"), ..Default::default() }),
            state: state as i32,
            created_at,
            labels: [
                (labels::POD_UID.to_owned(), uid.to_owned()),
                (labels::POD_NAME.to_owned(), pod.to_owned()),
                (labels::POD_NAMESPACE.to_owned(), "default".to_owned()),
            ]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_ready_sandboxes_and_running_containers_make_pods() {
        use api::ContainerState::{ContainerCreated, ContainerExited, ContainerRunning};
        let sandboxes = [sandbox("s1", "u1", "web", true), sandbox("s2", "u2", "done", false)];
        let containers = [
            container("u1", "web", "side", ContainerRunning, 2),
            container("u1", "web", "main", ContainerRunning, 1),
            container("u1", "web", "old", ContainerExited, 0),
            container("u1", "web", "new", ContainerCreated, 3),
            container("u2", "done", "main", ContainerExited, 1),
            // A running container whose sandbox is not ready still lists its pod.
            container("u3", "orphan", "main", ContainerRunning, 1),
        ];
        let pods = to_api_pods(&sandboxes, &containers);
        let json = serde_json::to_value(&pods).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "orphan", "namespace": "default", "uid": "u3"},
                 "spec": {"containers": [{"name": "main", "image": "main:1"}]}},
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                 "spec": {"containers": [{"name": "main", "image": "main:1"}, {"name": "side", "image": "side:1"}]}},
            ])
        );
    }

    #[test]
    fn objects_not_made_by_a_kubelet_are_skipped() {
        let mut foreign = container("u1", "web", "main", api::ContainerState::ContainerRunning, 1);
        foreign.labels.clear();
        let mut nameless = sandbox("s1", "u2", "x", true);
        nameless.metadata = None;
        assert!(to_api_pods(&[nameless], &[foreign]).is_empty());
        // A ready sandbox alone is a pod without containers.
        let pods = to_api_pods(&[sandbox("s1", "u1", "web", true)], &[]);
        assert_eq!(pods.len(), 1);
        assert!(pods[0].spec.as_ref().unwrap().containers.is_empty());
    }
}
