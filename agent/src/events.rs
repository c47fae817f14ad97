//! Kubernetes-style events the agent records (`record.EventRecorder` upstream). In
//! standalone mode they are kept in a bounded in-memory list served at `/events`
//! (newest last) and logged; the API-server mode will also post them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// How many events are kept.
pub const MAX_EVENTS: usize = 1000;

/// `Normal` or `Warning`, as upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// Records events about objects.
pub trait EventRecorder: Send + Sync + std::fmt::Debug {
    fn record(&self, object: ObjectReference, type_: EventType, reason: &str, message: String);
}

/// Bounded in-memory recorder; identical events are folded into one with a count.
#[derive(Debug, Clone)]
pub struct MemoryRecorder {
    host: String,
    events: Arc<Mutex<VecDeque<Event>>>,
}

impl MemoryRecorder {
    #[must_use]
    pub fn new(host: &str) -> Self {
        Self { host: host.to_string(), events: Arc::new(Mutex::new(VecDeque::new())) }
    }

    /// A copy of the events, oldest first.
    #[must_use]
    pub fn list(&self) -> Vec<Event> {
        self.events.lock().unwrap().iter().cloned().collect()
    }
}

impl EventRecorder for MemoryRecorder {
    fn record(&self, object: ObjectReference, type_: EventType, reason: &str, message: String) {
        let _ = self.append(object, type_, reason, message);
    }
}

impl MemoryRecorder {
    /// Records the event; returns it when it is new (`None` when it was folded into an
    /// identical earlier one).
    fn append(&self, object: ObjectReference, type_: EventType, reason: &str, message: String) -> Option<Event> {
        let type_str = match type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        match type_ {
            EventType::Normal => tracing::info!(object = ?object.name, reason, %message, "event"),
            EventType::Warning => tracing::warn!(object = ?object.name, reason, %message, "event"),
        }
        let now = Time(Timestamp::now());
        let mut events = self.events.lock().unwrap();
        if let Some(e) = events.iter_mut().rev().find(|e| {
            e.involved_object == object && e.reason.as_deref() == Some(reason) && e.message.as_deref() == Some(&message)
        }) {
            e.count = Some(e.count.unwrap_or(1) + 1);
            e.last_timestamp = Some(now);
            return None;
        }
        let name = format!("{}.{:x}", object.name.as_deref().unwrap_or("unknown"), Timestamp::now().as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(object.namespace.clone().unwrap_or_else(|| "default".into())),
                ..Default::default()
            },
            involved_object: object,
            reason: Some(reason.to_string()),
            message: Some(message),
            type_: Some(type_str.to_string()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource { component: Some("kubelet".into()), host: Some(self.host.clone()) }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.host.clone()),
            ..Default::default()
        };
        events.push_back(event.clone());
        while events.len() > MAX_EVENTS {
            events.pop_front();
        }
        Some(event)
    }
}

/// Reference to a pod for events.
#[must_use]
pub fn pod_ref(pod: &k8s_openapi::api::core::v1::Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// Reference to one container of a pod (upstream `GenerateContainerRef`): the pod, with
/// `fieldPath` `spec.containers{name}` or `spec.initContainers{name}`.
#[must_use]
pub fn container_ref(pod: &k8s_openapi::api::core::v1::Pod, container: &str) -> ObjectReference {
    let init = pod.spec.as_ref().is_some_and(|s| s.init_containers.iter().flatten().any(|c| c.name == container));
    let list = if init { "initContainers" } else { "containers" };
    ObjectReference { field_path: Some(format!("spec.{list}{{{container}}}")), ..pod_ref(pod) }
}

/// Reference to the node for node-level events.
#[must_use]
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        uid: Some(node.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_repeats_and_bounds() {
        let r = MemoryRecorder::new("n");
        for _ in 0..3 {
            r.record(node_ref("n"), EventType::Warning, "Bad", "same".into());
        }
        let l = r.list();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].count, Some(3));
        for i in 0..MAX_EVENTS + 5 {
            r.record(node_ref("n"), EventType::Normal, "X", format!("m{i}"));
        }
        assert_eq!(r.list().len(), MAX_EVENTS);
    }
}

/// Records events in memory (for `/events`) and posts them to the API server, one at a
/// time through the agent's events client, whose token bucket (`eventRecordQPS` /
/// `eventBurst`) spaces them as upstream's event client does. Events wait in a queue of
/// [`EVENT_QUEUE`]; when it is full (the API server slow or gone), new ones are not posted,
/// as upstream's broadcaster drops them, never queued without bound.
#[derive(Debug, Clone)]
pub struct ApiRecorder {
    memory: MemoryRecorder,
    tx: tokio::sync::mpsc::Sender<Event>,
}

/// Events waiting to be posted (upstream's broadcaster queues 1000).
pub const EVENT_QUEUE: usize = 1000;

impl ApiRecorder {
    /// Returns the recorder and the task that posts events.
    pub fn new(
        memory: MemoryRecorder,
        client: kube::Client,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Event>(EVENT_QUEUE);
        let task = async move {
            while let Some(ev) = rx.recv().await {
                let ns = ev.metadata.namespace.clone().unwrap_or_else(|| "default".into());
                let api: kube::Api<Event> = kube::Api::namespaced(client.clone(), &ns);
                if let Err(e) = api.create(&kube::api::PostParams::default(), &ev).await {
                    tracing::debug!(error = %e, "failed to post event");
                }
            }
        };
        (Self { memory, tx }, task)
    }
}

impl EventRecorder for ApiRecorder {
    fn record(&self, object: ObjectReference, type_: EventType, reason: &str, message: String) {
        if let Some(ev) = self.memory.append(object, type_, reason, message)
            && self.tx.try_send(ev).is_err()
        {
            tracing::debug!("event queue full; event not posted");
        }
    }
}
