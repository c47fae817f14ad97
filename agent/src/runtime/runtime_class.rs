//! A pod's `runtimeClassName` → the CRI runtime handler, as upstream's runtime class
//! manager (`pkg/kubelet/runtimeclass`): no class (or `""`) is the runtime's default
//! handler `""`; a class is looked up in the API (`node.k8s.io/v1` `RuntimeClass`) and its
//! `handler` used; a class that does not exist fails the pod's sandbox creation
//! (`FailedCreatePodSandBox`: `Failed to create pod sandbox: runtimeclass.node.k8s.io
//! "<name>" not found`), and the next sync tries again. Without an API server (standalone)
//! every pod gets the default handler, as upstream's kubelet has no runtime class manager
//! without a client.
//!
//! Deviation: upstream keeps an informer (a watch of every `RuntimeClass` per node); swiftlet
//! asks the API server when a sandbox of a pod with a class is created, or a later sync
//! needs the handler it has not seen yet (image volumes, user namespaces after a restart),
//! and remembers the answer per class. One `GET` per sandbox of such a pod — rare on most
//! nodes — instead of a watch on every node of the fleet; a class's handler changed after a
//! sandbox was made affects the pod's next sandbox, as with upstream (a running sandbox
//! keeps its handler).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;

/// Why a pod's runtime class has no handler.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No such `RuntimeClass` (upstream returns the API's not-found error as it is).
    #[error("runtimeclass.node.k8s.io {0:?} not found")]
    NotFound(String),
    /// The API server did not answer.
    #[error("failed to lookup RuntimeClass {name}: {message}")]
    Api { name: String, message: String },
}

/// Where runtime classes are read.
#[async_trait::async_trait]
pub trait RuntimeClassSource: Send + Sync + std::fmt::Debug {
    /// The class's `handler`; `Ok(None)` when there is no such class.
    async fn handler(&self, name: &str) -> Result<Option<String>, String>;
}

/// The API server's runtime classes.
#[derive(Debug, Clone)]
pub struct KubeRuntimeClasses {
    api: kube::Api<RuntimeClass>,
}

impl KubeRuntimeClasses {
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { api: kube::Api::all(client) }
    }
}

#[async_trait::async_trait]
impl RuntimeClassSource for KubeRuntimeClasses {
    async fn handler(&self, name: &str) -> Result<Option<String>, String> {
        match self.api.get_opt(name).await {
            Ok(class) => Ok(class.map(|c| c.handler)),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The class name a pod asks for, if any (`""` is none).
fn class_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()).filter(|n| !n.is_empty())
}

/// Resolves pods' runtime classes to handlers (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct RuntimeClasses {
    /// `None`: standalone, every pod on the default handler.
    source: Option<Arc<dyn RuntimeClassSource>>,
    /// The last handler seen per class.
    seen: Arc<Mutex<HashMap<String, String>>>,
}

impl RuntimeClasses {
    /// Classes read from `source`; `None` (standalone): the default handler for all.
    #[must_use]
    pub fn new(source: Option<Arc<dyn RuntimeClassSource>>) -> Self {
        Self { source, seen: Arc::default() }
    }

    /// Looks the pod's class up now (for a new sandbox) and remembers its handler.
    ///
    /// # Errors
    /// The class does not exist, or the API server did not answer.
    pub async fn lookup(&self, pod: &Pod) -> Result<String, LookupError> {
        let (Some(source), Some(name)) = (&self.source, class_of(pod)) else { return Ok(String::new()) };
        match source.handler(name).await {
            Ok(Some(handler)) => {
                self.seen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(name.to_owned(), handler.clone());
                Ok(handler)
            }
            Ok(None) => Err(LookupError::NotFound(name.to_owned())),
            Err(message) => Err(LookupError::Api { name: name.to_owned(), message }),
        }
    }

    /// The handler last seen for the pod's class (`""` when none was seen, or standalone).
    #[must_use]
    pub fn cached(&self, pod: &Pod) -> String {
        match (&self.source, class_of(pod)) {
            (Some(_), Some(name)) => self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(name)
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// The handler last seen for the pod's class, looked up if it was not seen yet.
    ///
    /// # Errors
    /// As [`Self::lookup`], when it had to look.
    pub async fn handler(&self, pod: &Pod) -> Result<String, LookupError> {
        if let Some(name) = class_of(pod)
            && self.source.is_some()
            && let Some(h) = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(name)
        {
            return Ok(h.clone());
        }
        self.lookup(pod).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Fake {
        classes: Mutex<HashMap<String, String>>,
        down: Mutex<bool>,
        asked: Mutex<usize>,
    }

    #[async_trait::async_trait]
    impl RuntimeClassSource for Fake {
        async fn handler(&self, name: &str) -> Result<Option<String>, String> {
            *self.asked.lock().unwrap() += 1;
            if *self.down.lock().unwrap() {
                return Err("connection refused".into());
            }
            Ok(self.classes.lock().unwrap().get(name).cloned())
        }
    }

    fn pod(class: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"runtimeClassName": class, "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_class_maps_to_its_handler_and_a_missing_one_fails_as_upstream() {
        let fake = Arc::new(Fake::default());
        fake.classes.lock().unwrap().insert("gvisor".into(), "runsc".into());
        let classes = RuntimeClasses::new(Some(fake.clone()));
        assert_eq!(classes.lookup(&pod(None)).await.unwrap(), "");
        assert_eq!(classes.lookup(&pod(Some(""))).await.unwrap(), "");
        assert_eq!(*fake.asked.lock().unwrap(), 0, "no class, no request");
        assert_eq!(classes.lookup(&pod(Some("gvisor"))).await.unwrap(), "runsc");
        let missing = classes.lookup(&pod(Some("kata"))).await.unwrap_err();
        assert_eq!(missing.to_string(), r#"runtimeclass.node.k8s.io "kata" not found"#);

        // Seen once, the handler serves later syncs without a request, also while the API
        // server is away; a new sandbox asks again.
        *fake.down.lock().unwrap() = true;
        let asked = *fake.asked.lock().unwrap();
        assert_eq!(classes.handler(&pod(Some("gvisor"))).await.unwrap(), "runsc");
        assert_eq!(classes.cached(&pod(Some("gvisor"))), "runsc");
        assert_eq!(classes.cached(&pod(Some("kata"))), "");
        assert_eq!(*fake.asked.lock().unwrap(), asked);
        let e = classes.lookup(&pod(Some("gvisor"))).await.unwrap_err();
        assert_eq!(e.to_string(), "failed to lookup RuntimeClass gvisor: connection refused");
    }

    #[tokio::test]
    async fn standalone_runs_every_pod_on_the_default_handler() {
        let classes = RuntimeClasses::new(None);
        assert_eq!(classes.lookup(&pod(Some("gvisor"))).await.unwrap(), "");
        assert_eq!(classes.handler(&pod(Some("gvisor"))).await.unwrap(), "");
        assert_eq!(classes.cached(&pod(Some("gvisor"))), "");
    }
}
