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
            return;
        }
        let name = format!("{}.{:x}", object.name.as_deref().unwrap_or("unknown"), Timestamp::now().as_nanosecond());
        events.push_back(Event {
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
        });
        while events.len() > MAX_EVENTS {
            events.pop_front();
        }
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
