//! The event correlator (client-go `tools/record/events_cache.go`, `EventCorrelator`):
//! every event the agent posts to the API server passes through it first, so an object
//! that fails the same way every second cannot flood the API server with events.
//!
//! Three stages, in upstream's order:
//! 1. **Aggregation** ([`EventCorrelator::correlate`], upstream `EventAggregator`): events
//!    that differ only in their message (same source, object, type, reason, reporting
//!    controller and instance; the object's `fieldPath` is not compared) form a group that
//!    remembers their distinct messages. Once a group has seen
//!    [`AGGREGATE_MAX_EVENTS`] distinct messages, each with less than
//!    [`AGGREGATE_INTERVAL`] since the group's previous event, an event of the group is
//!    replaced by one with the message `(combined from similar events): <message>`, which
//!    is counted under the group's key: the first such event is created, the later ones
//!    update it. A pause longer than the interval starts the group afresh.
//! 2. **Counting** (upstream `eventLogger`): an event seen before (same key, message
//!    included) becomes an update of the API object posted for it: its name, its
//!    `firstTimestamp`, the count plus one, sent as a strategic-merge patch of `count`,
//!    `lastTimestamp` and `message`.
//! 3. **Spam filter** (upstream `EventSourceObjectSpamFilter`): a token bucket per source,
//!    object and event type, [`SPAM_BURST`] events at once and then one per five minutes
//!    ([`SPAM_QPS`]); events over it are dropped, updates included. The count of a
//!    dropped update is not lost: the next update that passes carries it.
//!
//! Each stage keeps its state in an LRU cache of [`LRU_CACHE_SIZE`] entries, so memory
//! stays bounded however many objects misbehave.
//!
//! Deviations, none of them visible on the API: the caches are keyed by structs where
//! upstream concatenates the fields into one string (so `ab`+`c` cannot meet `a`+`bc`);
//! messages are remembered as SHA-256 digests (a group remembers up to ten, and a probe's
//! output alone can be 10 KiB); a group that reaches its limit forgets its oldest message
//! where upstream forgets an arbitrary one; and the time is passed in (`now`) rather than
//! read from a clock, which is what the tests need.

use std::collections::VecDeque;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sha2::{Digest as _, Sha256};

use super::lru::Lru;

/// Entries of each cache (upstream `maxLruCacheEntries`).
pub const LRU_CACHE_SIZE: usize = 4096;
/// Distinct messages of similar events after which they are combined (upstream
/// `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_EVENTS: usize = 10;
/// How long a group of similar events is remembered after its latest event (upstream
/// `defaultAggregateIntervalInSeconds`).
pub const AGGREGATE_INTERVAL: Duration = Duration::from_mins(10);
/// Events a source may post about one object at once (upstream `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// Refill of a source's and object's bucket, in events per second: one per five minutes
/// (upstream `defaultSpamQPS`).
pub const SPAM_QPS: f64 = 1.0 / 300.0;
/// Prefix of a combined event's message (upstream `EventAggregatorByReasonMessageFunc`).
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// The correlator's settings (upstream `CorrelatorOptions`, without the pluggable key
/// and message functions).
#[derive(Clone, Debug)]
pub struct CorrelatorOptions {
    /// Entries of each cache. Default [`LRU_CACHE_SIZE`] (4096).
    pub lru_cache_size: usize,
    /// Bucket size of the spam filter. Default [`SPAM_BURST`] (25).
    pub spam_burst: u32,
    /// Bucket refill of the spam filter, per second. Default [`SPAM_QPS`] (1/300).
    pub spam_qps: f64,
    /// Distinct messages before aggregation. Default [`AGGREGATE_MAX_EVENTS`] (10).
    pub aggregate_max_events: usize,
    /// Quiet time after which a group starts afresh. Default [`AGGREGATE_INTERVAL`] (10m).
    pub aggregate_interval: Duration,
}

impl Default for CorrelatorOptions {
    fn default() -> Self {
        Self {
            lru_cache_size: LRU_CACHE_SIZE,
            spam_burst: SPAM_BURST,
            spam_qps: SPAM_QPS,
            aggregate_max_events: AGGREGATE_MAX_EVENTS,
            aggregate_interval: AGGREGATE_INTERVAL,
        }
    }
}

/// What to do with an event after correlation (upstream `EventCorrelateResult`).
#[derive(Clone, Debug, PartialEq)]
pub enum Correlation {
    /// First of its kind: create it.
    Create(Event),
    /// A repeat: apply `patch` (strategic merge) to the event named
    /// `event.metadata.name`; if that is gone, create `event` instead.
    Update { event: Event, patch: serde_json::Value },
    /// Dropped by the spam filter.
    Skip,
}

/// Filters, combines and counts events before they are posted (see the module docs).
#[derive(Debug)]
pub struct EventCorrelator {
    options: CorrelatorOptions,
    /// Aggregation: the recent distinct messages of each group of similar events.
    groups: Lru<AggregateKey, Group>,
    /// Counting: the API object posted for each event (or combined event) seen.
    seen: Lru<LogKey, Observation>,
    /// Spam filter: a token bucket per source and object.
    buckets: Lru<SpamKey, Bucket>,
}

impl Default for EventCorrelator {
    fn default() -> Self {
        Self::new(CorrelatorOptions::default())
    }
}

impl EventCorrelator {
    #[must_use]
    pub fn new(options: CorrelatorOptions) -> Self {
        let size = options.lru_cache_size;
        Self { options, groups: Lru::new(size), seen: Lru::new(size), buckets: Lru::new(size) }
    }

    /// Correlates `event` (as the agent made it: count 1, both timestamps its time) at
    /// `now` (upstream `EventCorrelate`).
    pub fn correlate(&mut self, event: Event, now: Timestamp) -> Correlation {
        let (event, key) = self.aggregate(event, now);
        let (event, patch) = self.observe(event, key);
        if !self.allow(&event, now) {
            return Correlation::Skip;
        }
        match patch {
            Some(patch) => Correlation::Update { event, patch },
            None => Correlation::Create(event),
        }
    }

    /// Takes in the event as the API server stored it, so later updates name it and
    /// carry on from its count (upstream `UpdateState`).
    pub fn update_state(&mut self, stored: &Event) {
        self.seen.put(LogKey::Event(EventKey::of(stored)), Observation::of(stored));
    }

    /// Entries in the three caches (aggregation, counting, spam filter).
    #[must_use]
    pub fn cache_sizes(&self) -> [usize; 3] {
        [self.groups.len(), self.seen.len(), self.buckets.len()]
    }

    /// Aggregation: the event to go on with and the key to count it under.
    fn aggregate(&mut self, event: Event, now: Timestamp) -> (Event, LogKey) {
        let key = AggregateKey::of(&event);
        let interval = SignedDuration::try_from(self.options.aggregate_interval).unwrap_or(SignedDuration::MAX);
        let mut group = match self.groups.get(&key) {
            Some(g) if now.duration_since(g.last) <= interval => g.clone(),
            _ => Group { messages: VecDeque::new(), last: now },
        };
        let message = digest(event.message.as_deref().unwrap_or_default());
        if !group.messages.contains(&message) {
            group.messages.push_back(message);
        }
        group.last = now;
        let combine = group.messages.len() >= self.options.aggregate_max_events;
        if combine {
            // The group never remembers more than the limit.
            group.messages.pop_front();
        }
        self.groups.put(key.clone(), group);
        if !combine {
            let key = LogKey::Event(EventKey::of(&event));
            return (event, key);
        }
        let at = Time(now);
        let combined = Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    event.involved_object.name.as_deref().unwrap_or_default(),
                    now.as_nanosecond()
                )),
                namespace: event.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            count: Some(1),
            first_timestamp: Some(at.clone()),
            last_timestamp: Some(at),
            message: Some(format!("{COMBINED_PREFIX}{}", event.message.as_deref().unwrap_or_default())),
            // As upstream, the combined event carries no reporting controller or instance.
            involved_object: event.involved_object,
            type_: event.type_,
            reason: event.reason,
            source: event.source,
            ..Event::default()
        };
        (combined, LogKey::Aggregate(key))
    }

    /// Counting: a repeat takes the name, first timestamp and count of the event posted
    /// before, and gets the patch that updates it.
    fn observe(&mut self, mut event: Event, key: LogKey) -> (Event, Option<serde_json::Value>) {
        let patch = match self.seen.get(&key) {
            Some(before) if before.count > 0 => {
                event.metadata.name = Some(before.name.clone());
                event.metadata.resource_version.clone_from(&before.resource_version);
                event.first_timestamp.clone_from(&before.first_timestamp);
                event.count = Some(before.count.saturating_add(1));
                Some(update_patch(&event))
            }
            _ => None,
        };
        self.seen.put(key, Observation::of(&event));
        (event, patch)
    }

    /// Spam filter: whether the source may post this event about its object now.
    fn allow(&mut self, event: &Event, now: Timestamp) -> bool {
        let key = SpamKey::of(event);
        let mut bucket =
            self.buckets.get(&key).cloned().unwrap_or(Bucket { tokens: f64::from(self.options.spam_burst), last: now });
        let allowed = bucket.take(now, self.options.spam_qps, f64::from(self.options.spam_burst));
        self.buckets.put(key, bucket);
        allowed
    }
}

/// The patch of a repeat: what differs between the event and a copy without count,
/// message and with `lastTimestamp` at the epoch, as upstream computes it with
/// `CreateTwoWayMergePatch` (the other fields are equal, so only these three remain).
fn update_patch(event: &Event) -> serde_json::Value {
    let mut patch = serde_json::Map::new();
    patch.insert("count".into(), event.count.unwrap_or_default().into());
    patch.insert(
        "lastTimestamp".into(),
        event
            .last_timestamp
            .as_ref()
            .map_or(serde_json::Value::Null, |t| serde_json::to_value(t).expect("a timestamp serializes")),
    );
    if let Some(message) = event.message.as_deref().filter(|m| !m.is_empty()) {
        patch.insert("message".into(), message.into());
    }
    serde_json::Value::Object(patch)
}

fn digest(message: &str) -> [u8; 32] {
    Sha256::digest(message.as_bytes()).into()
}

/// A group of similar events: their recent distinct messages, oldest first, and the
/// time of the latest (upstream `aggregateRecord`).
#[derive(Clone, Debug)]
struct Group {
    messages: VecDeque<[u8; 32]>,
    last: Timestamp,
}

/// What the counting stage remembers of a posted event (upstream `eventLog`).
#[derive(Clone, Debug)]
struct Observation {
    count: i32,
    first_timestamp: Option<Time>,
    name: String,
    resource_version: Option<String>,
}

impl Observation {
    fn of(event: &Event) -> Self {
        Self {
            count: event.count.unwrap_or_default(),
            first_timestamp: event.first_timestamp.clone(),
            name: event.metadata.name.clone().unwrap_or_default(),
            resource_version: event.metadata.resource_version.clone(),
        }
    }
}

/// A token bucket of the spam filter (upstream: a `rate.Limiter` behind
/// `TryAccept`): full at first, refilled continuously.
#[derive(Clone, Debug)]
struct Bucket {
    tokens: f64,
    last: Timestamp,
}

impl Bucket {
    fn take(&mut self, now: Timestamp, qps: f64, burst: f64) -> bool {
        let elapsed = now.duration_since(self.last).as_secs_f64().max(0.0);
        let tokens = (self.tokens + elapsed * qps).min(burst);
        if tokens < 1.0 {
            return false;
        }
        self.tokens = tokens - 1.0;
        self.last = now;
        true
    }
}

/// The source and the object an event is about, without the object's `fieldPath`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ObjectKey {
    source_component: String,
    source_host: String,
    kind: String,
    namespace: String,
    name: String,
    uid: String,
    api_version: String,
}

impl ObjectKey {
    fn of(event: &Event) -> Self {
        let source = event.source.as_ref();
        let s = |v: Option<&String>| v.cloned().unwrap_or_default();
        let o = &event.involved_object;
        Self {
            source_component: s(source.and_then(|s| s.component.as_ref())),
            source_host: s(source.and_then(|s| s.host.as_ref())),
            kind: s(o.kind.as_ref()),
            namespace: s(o.namespace.as_ref()),
            name: s(o.name.as_ref()),
            uid: s(o.uid.as_ref()),
            api_version: s(o.api_version.as_ref()),
        }
    }
}

/// Spam filter key (upstream `getSpamKey`): source, object and type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SpamKey {
    object: ObjectKey,
    type_: String,
}

impl SpamKey {
    fn of(event: &Event) -> Self {
        Self { object: ObjectKey::of(event), type_: event.type_.clone().unwrap_or_default() }
    }
}

/// Aggregation key (upstream `EventAggregatorByReasonFunc`): everything but the message
/// (and the object's `fieldPath`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AggregateKey {
    object: ObjectKey,
    type_: String,
    reason: String,
    reporting_controller: String,
    reporting_instance: String,
}

impl AggregateKey {
    fn of(event: &Event) -> Self {
        Self {
            object: ObjectKey::of(event),
            type_: event.type_.clone().unwrap_or_default(),
            reason: event.reason.clone().unwrap_or_default(),
            reporting_controller: event.reporting_component.clone().unwrap_or_default(),
            reporting_instance: event.reporting_instance.clone().unwrap_or_default(),
        }
    }
}

/// An event's own key (upstream `getEventKey`): source, object with its `fieldPath`,
/// type, reason and message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    object: ObjectKey,
    field_path: String,
    type_: String,
    reason: String,
    message: [u8; 32],
}

impl EventKey {
    fn of(event: &Event) -> Self {
        Self {
            object: ObjectKey::of(event),
            field_path: event.involved_object.field_path.clone().unwrap_or_default(),
            type_: event.type_.clone().unwrap_or_default(),
            reason: event.reason.clone().unwrap_or_default(),
            message: digest(event.message.as_deref().unwrap_or_default()),
        }
    }
}

/// What the counting stage counts under: an event's own key, or the key of the group
/// whose combined event it became.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum LogKey {
    Event(EventKey),
    Aggregate(AggregateKey),
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use serde_json::json;

    use super::*;

    fn t0() -> Timestamp {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        t0() + SignedDuration::from_secs(secs)
    }

    fn pod(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            field_path: Some("spec.containers{c}".into()),
            ..ObjectReference::default()
        }
    }

    /// An event as the recorder makes it, at `now`.
    fn event(object: ObjectReference, reason: &str, message: &str, now: Timestamp) -> Event {
        let time = Time(now);
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", object.name.as_deref().unwrap(), now.as_nanosecond())),
                namespace: object.namespace.clone(),
                ..ObjectMeta::default()
            },
            involved_object: object,
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(time.clone()),
            last_timestamp: Some(time),
            source: Some(EventSource { component: Some("kubelet".into()), host: Some("node-1".into()) }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some("node-1".into()),
            ..Event::default()
        }
    }

    fn created(c: Correlation) -> Event {
        match c {
            Correlation::Create(e) => e,
            other => panic!("expected a create, got {other:?}"),
        }
    }

    fn updated(c: Correlation) -> (Event, serde_json::Value) {
        match c {
            Correlation::Update { event, patch } => (event, patch),
            other => panic!("expected an update, got {other:?}"),
        }
    }

    #[test]
    fn a_repeat_is_a_count_patch_of_the_first_event() {
        let mut c = EventCorrelator::default();
        let first = created(c.correlate(event(pod("p"), "Unhealthy", "same", at(0)), at(0)));
        assert_eq!(first.count, Some(1));
        let name = first.metadata.name.clone().unwrap();
        // The API server stored it with a resourceVersion.
        let mut stored = first.clone();
        stored.metadata.resource_version = Some("41".into());
        c.update_state(&stored);

        let (second, patch) = updated(c.correlate(event(pod("p"), "Unhealthy", "same", at(3)), at(3)));
        assert_eq!(second.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(second.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(second.first_timestamp, Some(Time(at(0))));
        assert_eq!(second.last_timestamp, Some(Time(at(3))));
        assert_eq!(second.count, Some(2));
        assert_eq!(patch, json!({"count": 2, "lastTimestamp": "2026-12-01T10:00:03Z", "message": "same"}));

        // Without an answer from the server (say, the patch is in flight), counting goes on.
        let (third, patch) = updated(c.correlate(event(pod("p"), "Unhealthy", "same", at(4)), at(4)));
        assert_eq!((third.count, patch["count"].clone()), (Some(3), json!(3)));
        assert_eq!(third.metadata.name.as_deref(), Some(name.as_str()));
    }

    #[test]
    fn the_server_count_is_where_counting_resumes() {
        let mut c = EventCorrelator::default();
        let mut first = created(c.correlate(event(pod("p"), "R", "m", at(0)), at(0)));
        first.count = Some(7);
        c.update_state(&first);
        let (e, _) = updated(c.correlate(event(pod("p"), "R", "m", at(1)), at(1)));
        assert_eq!(e.count, Some(8));
    }

    #[test]
    fn ten_distinct_messages_make_a_combined_event_whose_count_grows() {
        let mut c = EventCorrelator::default();
        let msg = |i: usize| format!("Liveness probe errored and resulted in unknown state: exec {i} failed");
        for i in 0..9 {
            let e = created(c.correlate(event(pod("p"), "Unhealthy", &msg(i), at(i as i64)), at(i as i64)));
            assert_eq!(e.message.as_deref(), Some(msg(i).as_str()));
        }
        let combined = created(c.correlate(event(pod("p"), "Unhealthy", &msg(9), at(9)), at(9)));
        assert_eq!(combined.message, Some(format!("(combined from similar events): {}", msg(9))));
        assert_eq!(combined.count, Some(1));
        assert_eq!(
            (combined.first_timestamp.clone(), combined.last_timestamp.clone()),
            (Some(Time(at(9))), Some(Time(at(9))))
        );
        assert_eq!(combined.involved_object, pod("p"));
        assert_eq!((combined.reason.as_deref(), combined.type_.as_deref()), (Some("Unhealthy"), Some("Warning")));
        assert_eq!(combined.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(combined.metadata.name, Some(format!("p.{:x}", at(9).as_nanosecond())));
        assert_eq!((combined.reporting_component.clone(), combined.reporting_instance.clone()), (None, None));
        let name = combined.metadata.name.clone();

        for (n, i) in (10..15).enumerate() {
            let (e, patch) = updated(c.correlate(event(pod("p"), "Unhealthy", &msg(i), at(i as i64)), at(i as i64)));
            assert_eq!(e.metadata.name, name, "the combined event is updated");
            assert_eq!(e.count, Some(n as i32 + 2));
            assert_eq!(e.first_timestamp, Some(Time(at(9))));
            let message = format!("(combined from similar events): {}", msg(i));
            assert_eq!(
                patch,
                json!({"count": n + 2, "lastTimestamp": format!("2026-12-01T10:00:{i}Z"), "message": message})
            );
        }
    }

    #[test]
    fn similar_means_same_reason_source_object_and_type() {
        let mut c = EventCorrelator::default();
        for i in 0..9 {
            created(c.correlate(event(pod("p"), "Unhealthy", &format!("m{i}"), at(0)), at(0)));
        }
        // Another reason, another object, another type: each its own group, not combined.
        let other_reason = created(c.correlate(event(pod("p"), "Killing", "m9", at(0)), at(0)));
        let other_pod = created(c.correlate(event(pod("q"), "Unhealthy", "m9", at(0)), at(0)));
        let mut normal = event(pod("p"), "Unhealthy", "m9", at(0));
        normal.type_ = Some("Normal".into());
        let normal = created(c.correlate(normal, at(0)));
        for e in [other_reason, other_pod, normal] {
            assert_eq!(e.message.as_deref(), Some("m9"));
        }
        // Another container of the same pod is the same object: the tenth message combines.
        let mut other_container = event(pod("p"), "Unhealthy", "m9", at(0));
        other_container.involved_object.field_path = Some("spec.containers{d}".into());
        let e = created(c.correlate(other_container, at(0)));
        assert_eq!(e.message.as_deref(), Some("(combined from similar events): m9"));
    }

    #[test]
    fn a_repeated_message_is_counted_not_combined() {
        let mut c = EventCorrelator::default();
        created(c.correlate(event(pod("p"), "R", "same", at(0)), at(0)));
        for i in 1..20 {
            let (e, _) = updated(c.correlate(event(pod("p"), "R", "same", at(i)), at(i)));
            assert_eq!((e.message.as_deref(), e.count), (Some("same"), Some(i as i32 + 1)));
        }
    }

    #[test]
    fn the_group_starts_afresh_after_ten_quiet_minutes() {
        let mut c = EventCorrelator::default();
        for i in 0..9 {
            created(c.correlate(event(pod("p"), "R", &format!("m{i}"), at(i)), at(i)));
        }
        // Ten minutes after the last one, to the second, the group still holds.
        let e = created(c.correlate(event(pod("p"), "R", "m9", at(608)), at(608)));
        assert!(e.message.unwrap().starts_with(COMBINED_PREFIX));
        // Over ten minutes of quiet: the new message is no longer combined.
        let later = at(608 + 601);
        let e = created(c.correlate(event(pod("p"), "R", "m10", later), later));
        assert_eq!(e.message.as_deref(), Some("m10"));
        // And it takes ten distinct messages again.
        for i in 11..19 {
            let e = created(c.correlate(event(pod("p"), "R", &format!("m{i}"), later), later));
            assert_eq!(e.message, Some(format!("m{i}")));
        }
        // The combined event of the group is still known: it is updated, not made anew.
        let (e, _) = updated(c.correlate(event(pod("p"), "R", "m19", later), later));
        assert_eq!(e.message.as_deref(), Some("(combined from similar events): m19"));
        assert_eq!((e.count, e.first_timestamp), (Some(2), Some(Time(at(608)))));
    }

    #[test]
    fn the_spam_filter_lets_25_through_then_one_per_five_minutes() {
        let mut c = EventCorrelator::default();
        let mut passed = 0;
        for i in 0..40 {
            // Distinct reasons, so neither aggregation nor counting is involved.
            match c.correlate(event(pod("p"), &format!("R{i}"), "m", at(0)), at(0)) {
                Correlation::Create(_) => passed += 1,
                Correlation::Skip => {}
                other @ Correlation::Update { .. } => panic!("{other:?}"),
            }
        }
        assert_eq!(passed, 25, "a burst of 25, the 26th is dropped");
        // Another object (or another type) has a bucket of its own.
        assert!(matches!(c.correlate(event(pod("q"), "R0", "m", at(0)), at(0)), Correlation::Create(_)));
        // One token is back after five minutes, not before.
        assert_eq!(c.correlate(event(pod("p"), "X1", "m", at(299)), at(299)), Correlation::Skip);
        assert!(matches!(c.correlate(event(pod("p"), "X2", "m", at(300)), at(300)), Correlation::Create(_)));
        assert_eq!(c.correlate(event(pod("p"), "X3", "m", at(301)), at(301)), Correlation::Skip);
    }

    #[test]
    fn dropped_repeats_still_count() {
        let mut c = EventCorrelator::default();
        created(c.correlate(event(pod("p"), "R", "same", at(0)), at(0)));
        for _ in 1..25 {
            updated(c.correlate(event(pod("p"), "R", "same", at(0)), at(0)));
        }
        // The bucket is empty: the 26th to the 30th are dropped, but counted.
        for _ in 0..5 {
            assert_eq!(c.correlate(event(pod("p"), "R", "same", at(0)), at(0)), Correlation::Skip);
        }
        let (e, patch) = updated(c.correlate(event(pod("p"), "R", "same", at(300)), at(300)));
        assert_eq!((e.count, patch["count"].clone()), (Some(31), json!(31)));
    }

    #[test]
    fn the_caches_are_bounded() {
        let mut c = EventCorrelator::default();
        for i in 0..LRU_CACHE_SIZE + 100 {
            let _ = c.correlate(event(pod(&format!("p{i}")), "R", "m", at(0)), at(0));
        }
        assert_eq!(c.cache_sizes(), [LRU_CACHE_SIZE; 3]);
        // The first pods were forgotten: their next event is created anew, not counted.
        created(c.correlate(event(pod("p0"), "R", "m", at(1)), at(1)));
        // The latest are remembered.
        let latest = format!("p{}", LRU_CACHE_SIZE + 99);
        updated(c.correlate(event(pod(&latest), "R", "m", at(1)), at(1)));
    }
}
