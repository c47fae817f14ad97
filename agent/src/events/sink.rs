//! Writing events to the API server as client-go's broadcaster does
//! (`tools/record/event.go`, `recordToSink` and `recordEvent`): each event is first
//! correlated ([`EventCorrelator`]), then created, or, for a repeat, patched (strategic
//! merge of `count`, `lastTimestamp` and `message`); a patch that finds the event gone
//! (deleted, or expired by the API server's event TTL) creates it instead. What the API
//! server answers is fed back to the correlator, so the next update names the stored
//! event and carries on from its count.
//!
//! Retries follow upstream: an API server that cannot be reached is tried again after
//! [`RETRY_SLEEP`] (the first pause a random fraction of it, so that nodes do not all come
//! back at once), up to [`MAX_TRIES`] tries in all; an error status from the API server
//! (the event is invalid, its namespace is being deleted, ...) or a request that cannot be
//! built is final. Events are written one at a time, so while one is retried the next
//! ones wait in the recorder's queue, which drops what does not fit, as upstream.
//!
//! Deviation: client-go's REST client itself waits and retries an answer of `429` or a
//! `5xx` with `Retry-After` before the broadcaster sees it; kube's client does not, so
//! such an answer is a final rejection here.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::correlator::{Correlation, EventCorrelator};

/// Tries to write one event before giving up (upstream `maxTriesPerEvent`).
pub const MAX_TRIES: u32 = 12;
/// Pause between tries (upstream `defaultSleepDuration`).
pub const RETRY_SLEEP: Duration = Duration::from_secs(10);

/// Why an event was not written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server answered with an error status; not retried.
    #[error("the API server rejected event {name}")]
    Rejected {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The request could not be built, and would be built the same way again.
    #[error("cannot build the request for event {name}")]
    Request {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The API server could not be reached in [`MAX_TRIES`] tries.
    #[error("event {name} not written after {tries} tries")]
    GaveUp {
        name: String,
        tries: u32,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// A rejection that upstream expects and only logs at a high verbosity: the event
    /// exists already, or its namespace is being deleted.
    #[must_use]
    pub fn is_expected(&self) -> bool {
        match self {
            Error::Rejected { source: kube::Error::Api(status), .. } => {
                status.is_already_exists()
                    || status
                        .details
                        .as_ref()
                        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
            }
            _ => false,
        }
    }
}

/// Correlates events and writes them, one at a time (see the module docs).
pub struct EventSink {
    client: kube::Client,
    correlator: EventCorrelator,
    retry_sleep: Duration,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink").field("correlator", &self.correlator).finish_non_exhaustive()
    }
}

impl EventSink {
    /// Writes through `client` (the agent's events client, throttled by
    /// `eventRecordQPS` / `eventBurst`).
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client, correlator: EventCorrelator::default(), retry_sleep: RETRY_SLEEP }
    }

    /// Correlates `event` and writes the outcome, retrying while the API server cannot
    /// be reached. `Ok` also when the spam filter dropped it.
    pub async fn record(&mut self, event: Event) -> Result<(), Error> {
        let (event, patch) = match self.correlator.correlate(event, Timestamp::now()) {
            Correlation::Skip => {
                tracing::trace!("event dropped by the spam filter");
                return Ok(());
            }
            Correlation::Create(event) => (event, None),
            Correlation::Update { event, patch } => (event, Some(patch)),
        };
        let name = || event.metadata.name.clone().unwrap_or_default();
        let mut tries = 0;
        loop {
            let source = match self.write(&event, patch.as_ref()).await {
                Ok(stored) => {
                    self.correlator.update_state(&stored);
                    return Ok(());
                }
                Err(source @ kube::Error::Api(_)) => return Err(Error::Rejected { name: name(), source }),
                Err(source @ (kube::Error::BuildRequest(_) | kube::Error::HttpError(_))) => {
                    return Err(Error::Request { name: name(), source });
                }
                Err(source) => source,
            };
            tries += 1;
            if tries >= MAX_TRIES {
                return Err(Error::GaveUp { name: name(), tries, source });
            }
            tracing::debug!(event = %name(), error = %source, "unable to write event; will retry");
            let pause = if tries == 1 { self.retry_sleep.mul_f64(rand::random::<f64>()) } else { self.retry_sleep };
            tokio::time::sleep(pause).await;
        }
    }

    /// One try: the patch when there is one, a create when there is none or the event
    /// to patch is gone.
    async fn write(&self, event: &Event, patch: Option<&serde_json::Value>) -> kube::Result<Event> {
        let namespace = event.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        if let Some(patch) = patch {
            let name = event.metadata.name.as_deref().unwrap_or_default();
            match api.patch(name, &PatchParams::default(), &Patch::Strategic(patch)).await {
                Err(kube::Error::Api(status)) if status.is_not_found() => {}
                other => return other,
            }
        }
        if event.metadata.resource_version.is_some() {
            let mut event = event.clone();
            event.metadata.resource_version = None;
            return api.create(&PostParams::default(), &event).await;
        }
        api.create(&PostParams::default(), event).await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::{Arc, Mutex};

    use http_body_util::BodyExt as _;
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use serde_json::{Value, json};

    use super::*;

    /// A request the fake API server got.
    #[derive(Clone, Debug)]
    pub(crate) struct Seen {
        pub method: String,
        pub path: String,
        pub content_type: String,
        pub body: Value,
    }

    /// What the fake answers a request with, instead of doing what it asks.
    #[derive(Clone, Copy, Debug)]
    pub(crate) enum Fault {
        /// No answer: a transport error.
        Unreachable,
        /// An error status with this code.
        Status(u16),
    }

    /// An API server that stores events (create, strategic-merge patch of the fields
    /// the correlator patches), records every request and answers with queued faults
    /// first.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct FakeEventsApi {
        pub seen: Arc<Mutex<Vec<Seen>>>,
        pub events: Arc<Mutex<BTreeMap<String, Value>>>,
        pub faults: Arc<Mutex<VecDeque<Fault>>>,
    }

    impl FakeEventsApi {
        pub(crate) fn client(&self) -> kube::Client {
            let api = self.clone();
            let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let api = api.clone();
                async move { api.answer(req).await }
            });
            kube::Client::new(service, "default")
        }

        pub(crate) fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }

        async fn answer(
            &self,
            req: http::Request<kube::client::Body>,
        ) -> Result<http::Response<http_body_util::Full<bytes::Bytes>>, std::io::Error> {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
            let seen = Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_owned(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default(),
                body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            };
            self.seen.lock().unwrap().push(seen.clone());
            let fault = self.faults.lock().unwrap().pop_front();
            let (code, answer) = match fault {
                Some(Fault::Unreachable) => return Err(std::io::Error::other("connection refused")),
                Some(Fault::Status(code)) => (code, status(code, "Invalid", "rejected")),
                None => self.apply(&seen),
            };
            Ok(http::Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(answer.to_string())))
                .unwrap())
        }

        fn apply(&self, seen: &Seen) -> (u16, Value) {
            let mut events = self.events.lock().unwrap();
            let rv = (events.len() + 1).to_string();
            match seen.method.as_str() {
                "POST" => {
                    let mut event = seen.body.clone();
                    let name = event["metadata"]["name"].as_str().unwrap().to_owned();
                    if events.contains_key(&name) {
                        return (409, status(409, "AlreadyExists", "exists"));
                    }
                    event["metadata"]["resourceVersion"] = json!(rv);
                    events.insert(name, event.clone());
                    (201, event)
                }
                "PATCH" => {
                    let name = seen.path.rsplit('/').next().unwrap();
                    let Some(event) = events.get_mut(name) else {
                        return (404, status(404, "NotFound", &format!("events \"{name}\" not found")));
                    };
                    for (k, v) in seen.body.as_object().unwrap() {
                        event[k] = v.clone();
                    }
                    event["metadata"]["resourceVersion"] = json!(rv);
                    (200, event.clone())
                }
                other => panic!("unexpected {other}"),
            }
        }
    }

    fn status(code: u16, reason: &str, message: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code})
    }

    fn event(message: &str) -> Event {
        let now = Timestamp::now();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("p.{:x}", now.as_nanosecond())),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                ..ObjectReference::default()
            },
            reason: Some("Unhealthy".into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource { component: Some("kubelet".into()), host: Some("n".into()) }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some("n".into()),
            ..Event::default()
        }
    }

    const EVENTS: &str = "/api/v1/namespaces/ns/events";

    #[tokio::test]
    async fn a_repeat_is_posted_once_then_patched() {
        let api = FakeEventsApi::default();
        let mut sink = EventSink::new(api.client());
        for _ in 0..3 {
            sink.record(event("boom")).await.unwrap();
        }
        let seen = api.seen();
        assert_eq!(seen.len(), 3, "{seen:#?}");
        assert_eq!((seen[0].method.as_str(), seen[0].path.as_str()), ("POST", EVENTS));
        assert_eq!(seen[0].body["count"], json!(1));
        assert_eq!(seen[0].body["message"], json!("boom"));
        let name = seen[0].body["metadata"]["name"].as_str().unwrap();
        for (i, patch) in seen[1..].iter().enumerate() {
            assert_eq!((patch.method.as_str(), patch.path.clone()), ("PATCH", format!("{EVENTS}/{name}")));
            assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
            let body = patch.body.as_object().unwrap();
            assert_eq!(body.keys().collect::<Vec<_>>(), ["count", "lastTimestamp", "message"]);
            assert_eq!((body["count"].clone(), body["message"].clone()), (json!(i + 2), json!("boom")));
        }
        let stored = api.events.lock().unwrap()[name].clone();
        assert_eq!(stored["count"], json!(3));
    }

    #[tokio::test]
    async fn a_patch_of_a_deleted_event_creates_it_again() {
        let api = FakeEventsApi::default();
        let mut sink = EventSink::new(api.client());
        sink.record(event("boom")).await.unwrap();
        api.events.lock().unwrap().clear();
        sink.record(event("boom")).await.unwrap();
        let seen = api.seen();
        let methods: Vec<_> = seen.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(methods, ["POST", "PATCH", "POST"]);
        // Created again under its first name, with the count so far and no resourceVersion.
        assert_eq!(seen[2].body["metadata"]["name"], seen[0].body["metadata"]["name"]);
        assert_eq!(seen[2].body["count"], json!(2));
        assert_eq!(seen[2].body["metadata"].get("resourceVersion"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_api_server_is_retried_a_rejection_is_not() {
        let api = FakeEventsApi::default();
        let mut sink = EventSink::new(api.client());
        api.faults.lock().unwrap().extend([Fault::Unreachable, Fault::Unreachable]);
        let start = tokio::time::Instant::now();
        sink.record(event("a")).await.unwrap();
        assert_eq!(api.seen().len(), 3);
        let waited = start.elapsed();
        assert!(waited >= RETRY_SLEEP && waited <= RETRY_SLEEP * 2, "{waited:?}");

        api.faults.lock().unwrap().push_back(Fault::Status(422));
        let err = sink.record(event("b")).await.unwrap_err();
        assert!(matches!(err, Error::Rejected { .. }), "{err}");
        assert!(!err.is_expected());
        assert_eq!(api.seen().len(), 4, "not retried");
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_twelve_tries() {
        let api = FakeEventsApi::default();
        let mut sink = EventSink::new(api.client());
        api.faults.lock().unwrap().extend([Fault::Unreachable; 20]);
        let err = sink.record(event("a")).await.unwrap_err();
        assert!(matches!(err, Error::GaveUp { tries: 12, .. }), "{err}");
        assert_eq!(api.seen().len(), 12);
    }

    #[tokio::test]
    async fn an_existing_event_is_an_expected_rejection() {
        let api = FakeEventsApi::default();
        let mut sink = EventSink::new(api.client());
        let e = event("a");
        api.events.lock().unwrap().insert(e.metadata.name.clone().unwrap(), json!({}));
        let err = sink.record(e).await.unwrap_err();
        assert!(err.is_expected(), "{err}");
    }
}
