//! Kubernetes-style events the agent records (`record.EventRecorder` upstream). They are
//! logged and kept in a bounded in-memory list served at `/events` (newest last; an
//! identical event is folded into the earlier one with a count). In API-server mode the
//! [`ApiRecorder`] also posts them, each through the [`correlator`] first (upstream's
//! `EventCorrelator`: similar events combined, repeats sent as count updates, a spam
//! filter per object) and then the [`sink`], which creates or patches the API object.

pub mod correlator;
mod lru;
pub mod sink;

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
    /// Records the event and returns it as made (upstream `makeEvent`: count 1, both
    /// timestamps now), also when the list folded it into an identical earlier one: what
    /// to post is the correlator's decision.
    fn append(&self, object: ObjectReference, type_: EventType, reason: &str, message: String) -> Event {
        let type_str = match type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        match type_ {
            EventType::Normal => tracing::info!(object = ?object.name, reason, %message, "event"),
            EventType::Warning => tracing::warn!(object = ?object.name, reason, %message, "event"),
        }
        let at = Timestamp::now();
        let now = Time(at);
        let name = format!("{}.{:x}", object.name.as_deref().unwrap_or("unknown"), at.as_nanosecond());
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
        let mut events = self.events.lock().unwrap();
        if let Some(e) = events.iter_mut().rev().find(|e| {
            e.involved_object == event.involved_object && e.reason == event.reason && e.message == event.message
        }) {
            e.count = Some(e.count.unwrap_or(1) + 1);
            e.last_timestamp.clone_from(&event.last_timestamp);
            return event;
        }
        events.push_back(event.clone());
        while events.len() > MAX_EVENTS {
            events.pop_front();
        }
        event
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

    /// The flood of the issue: a liveness probe that errors every second with a new
    /// message each time. As upstream, nine events are created, then one combined event
    /// whose count grows, and the spam filter stops the object at 25 requests.
    #[tokio::test(start_paused = true)]
    async fn a_failing_probe_does_not_flood_the_api_server() {
        let api = sink::tests::FakeEventsApi::default();
        let (recorder, task) = ApiRecorder::new(MemoryRecorder::new("node-1"), api.client());
        let task = tokio::spawn(task);
        let pod = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            field_path: Some("spec.containers{app}".into()),
            ..Default::default()
        };
        let message = |i: usize| {
            format!(
                "Liveness probe errored and resulted in unknown state: rpc error: code = Unknown desc = exec {i} failed"
            )
        };
        for i in 0..40 {
            recorder.record(pod.clone(), EventType::Warning, "Unhealthy", message(i));
        }
        // The posting task drains the queue before paused time moves on.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let seen = api.seen();
        assert_eq!(seen.len(), 25, "the spam filter's burst");
        for (i, s) in seen[..9].iter().enumerate() {
            assert_eq!((s.method.as_str(), s.body["message"].as_str()), ("POST", Some(message(i).as_str())));
        }
        let combined = &seen[9];
        assert_eq!(combined.method, "POST");
        assert_eq!(combined.body["message"], format!("(combined from similar events): {}", message(9)));
        let name = combined.body["metadata"]["name"].as_str().unwrap();
        for (n, s) in seen[10..].iter().enumerate() {
            assert_eq!(
                (s.method.as_str(), s.path.as_str()),
                ("PATCH", format!("/api/v1/namespaces/ns/events/{name}").as_str())
            );
            assert_eq!(s.body["count"], n + 2);
            assert_eq!(s.body["message"], format!("(combined from similar events): {}", message(n + 10)));
        }
        // `/events` still lists every one of them.
        assert_eq!(recorder.memory.list().len(), 40);
        task.abort();
    }
}

/// Records events in memory (for `/events`) and posts them to the API server, one at a
/// time through the [`sink::EventSink`] (correlation, then a create or a patch) over the
/// agent's events client, whose token bucket (`eventRecordQPS` / `eventBurst`) spaces the
/// requests as upstream's event client does. Events wait in a queue of [`EVENT_QUEUE`];
/// when it is full (the API server slow or gone), new ones are not posted, as upstream's
/// broadcaster drops them, never queued without bound.
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
            let mut sink = sink::EventSink::new(client);
            while let Some(ev) = rx.recv().await {
                if let Err(e) = sink.record(ev).await {
                    let cause = std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
                    if e.is_expected() {
                        tracing::debug!(error = %e, %cause, "event not written");
                    } else {
                        tracing::warn!(error = %e, %cause, "event not written");
                    }
                }
            }
        };
        (Self { memory, tx }, task)
    }
}

impl EventRecorder for ApiRecorder {
    fn record(&self, object: ObjectReference, type_: EventType, reason: &str, message: String) {
        let ev = self.memory.append(object, type_, reason, message);
        if self.tx.try_send(ev).is_err() {
            tracing::debug!("event queue full; event not posted");
        }
    }
}
