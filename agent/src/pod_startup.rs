//! Pod start latency: `kubelet_pod_start_duration_seconds`,
//! `kubelet_pod_start_sli_duration_seconds` and `kubelet_pod_start_total_duration_seconds`
//! (upstream `pod_startup_latency_tracker.go` and the `PodStartDuration` observation of
//! `SyncPod`).
//!
//! - *Start duration*: from the agent first seeing the pod to the first status that turns
//!   the pod from `Pending` to `Running` (upstream also observes a pod's very first status,
//!   whatever its phase; so does this).
//! - *SLI* and *total*: a pod is tracked only when it is first seen without a
//!   `status.startTime` (it was scheduled after the agent started). The moment every
//!   container of the pod is running (each `state.running.startedAt` set) is noted when
//!   the agent computes that status; the durations are observed once the pod is then
//!   seen on the API watch with that status: from `metadata.creationTimestamp` to the
//!   watch, minus the span from the first image pull's start to the last pull's end (for
//!   the SLI). A terminal pod is forgotten.
//! - Deviation, standalone mode: static pods are never seen on a watch, so upstream never
//!   observes their SLI. swiftlet observes it when the status that shows every container
//!   running is computed (there is no API server to wait for), from the pod's creation
//!   timestamp, or from when the agent first saw it if the manifest has none.
//!
//! **Start traces** (beyond upstream; exported only when tracing is configured and the
//! trace is sampled): every pod the agent starts gets one trace, rooted at a
//! `podStartup` span that opens when the pod is first seen and ends when the pod is
//! `Ready` (or terminal, or gone: `k8s.pod.start.outcome` says which). Its children are
//! `admitPod`, and the `syncPod` runs until then with their steps
//! (`waitForAttachAndMount`, the sandbox's CRI calls, `ensureImageExists` with the pull,
//! `startContainer` per container with create/start); the root carries the events
//! `firstExec` (a container's first process, as the eBPF sensors saw it, at the
//! kernel's time) and `Ready`. The three pod start histograms carry the trace id as
//! their bucket's exemplar, so a slow bucket leads to the trace of a pod that landed in
//! it.

pub mod metrics;

use crate::types::pod::uid as pod_uid;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use opentelemetry::KeyValue;
use tracing::Span;

use crate::metrics::{TraceExemplar, TracedHistogram};
use metrics::PodStartupMetrics;

#[derive(Debug, Default, Clone)]
struct PerPod {
    first_started_pulling: Option<SystemTime>,
    last_finished_pulling: Option<SystemTime>,
    /// First time the agent computed a status with every container running.
    observed_running: Option<SystemTime>,
    recorded: bool,
}

/// A pod's start trace.
#[derive(Debug)]
struct StartTrace {
    /// The `podStartup` span while the start is under way.
    root: Option<Span>,
    /// Its trace id when sampled (kept after the root ends, for the exemplars).
    trace_id: Option<String>,
    /// The pod's (regular) containers, and those whose first exec was seen.
    containers: Vec<String>,
    first_execs: std::collections::HashSet<String>,
    /// The pod became `Ready`, the trace waits for the last first exec.
    ready: bool,
}

impl StartTrace {
    fn all_execs_seen(&self) -> bool {
        self.containers.iter().all(|c| self.first_execs.contains(c))
    }
}

/// How long a `Ready` start trace waits for a first exec the sensors have not reported
/// yet (the PLEG reports it once CRI agrees, which may be after the status that showed
/// the pod ready).
pub const FIRST_EXEC_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Tracks pod start latency (see the module docs).
#[derive(Debug)]
pub struct PodStartupTracker {
    pods: Mutex<HashMap<String, PerPod>>,
    traces: Arc<Mutex<HashMap<String, StartTrace>>>,
    metrics: Arc<PodStartupMetrics>,
    /// The eBPF sensors report first execs (the evented PLEG is on).
    first_execs_reported: std::sync::atomic::AtomicBool,
}

/// How a pod start trace ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOutcome {
    /// The pod became `Ready`.
    Ready,
    /// It reached `Succeeded` or `Failed` first.
    Terminal,
    /// Admission refused it.
    Rejected,
    /// It was removed or the agent stopped tracking it first.
    Gone,
}

impl StartOutcome {
    fn label(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Terminal => "terminal",
            Self::Rejected => "rejected",
            Self::Gone => "gone",
        }
    }
}

/// Whether the pod's `Ready` condition is true.
fn is_ready(status: &PodStatus) -> bool {
    status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Upstream `hasPodStartedSLO`: every container has been started (is running with a
/// `startedAt`).
fn all_containers_started(status: &PodStatus) -> bool {
    status
        .container_statuses
        .iter()
        .flatten()
        .all(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some_and(|r| r.started_at.is_some()))
}

fn is_terminal(status: Option<&PodStatus>) -> bool {
    matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn seconds_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Ends `trace`'s root span (if still open) with `outcome`.
fn finish(trace: &mut StartTrace, outcome: StartOutcome) {
    let Some(root) = trace.root.take() else { return };
    root.record("k8s.pod.start.outcome", outcome.label());
    if outcome != StartOutcome::Ready {
        crate::telemetry::record_error(&root, &format!("pod start ended: {}", outcome.label()));
    }
}

impl PodStartupTracker {
    #[must_use]
    pub fn new(metrics: Arc<PodStartupMetrics>) -> Self {
        Self {
            pods: Mutex::default(),
            traces: Arc::default(),
            metrics,
            first_execs_reported: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The evented PLEG reports first execs ([`Self::first_exec`]): a start trace then
    /// waits for them (at most [`FIRST_EXEC_WAIT`] after `Ready`).
    pub fn set_first_execs_reported(&self, reported: bool) {
        self.first_execs_reported.store(reported, std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts the pod's start trace (once per pod; not for a pod that is terminal or
    /// being deleted already).
    pub fn begin_trace(&self, pod: &Pod) {
        if is_terminal(pod.status.as_ref()) || pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        let mut traces = self.traces.lock().unwrap();
        if traces.contains_key(pod_uid(pod)) {
            return;
        }
        let root = crate::telemetry::pod_startup_span(pod);
        let trace_id = crate::telemetry::sampled_trace_id(&root);
        let containers = pod.spec.iter().flat_map(|s| s.containers.iter().map(|c| c.name.clone())).collect();
        traces.insert(
            pod_uid(pod).to_string(),
            StartTrace {
                root: Some(root),
                trace_id,
                containers,
                first_execs: std::collections::HashSet::new(),
                ready: false,
            },
        );
    }

    /// The open `podStartup` span of the pod, to parent the steps of its start.
    #[must_use]
    pub fn trace_root(&self, pod_uid: &str) -> Option<Span> {
        self.traces.lock().unwrap().get(pod_uid).and_then(|t| t.root.clone())
    }

    /// A container's first process started (the kernel's time), as the eBPF sensors saw;
    /// `container` is empty for the sandbox's.
    pub fn first_exec(&self, pod_uid: &str, container: &str, container_id: &str, when: SystemTime) {
        let mut traces = self.traces.lock().unwrap();
        let Some(trace) = traces.get_mut(pod_uid) else { return };
        let Some(root) = &trace.root else { return };
        let mut attributes = vec![KeyValue::new("container.id", container_id.to_owned())];
        if !container.is_empty() {
            attributes.push(KeyValue::new("k8s.container.name", container.to_owned()));
        }
        crate::telemetry::add_span_event(root, "firstExec", when, attributes);
        trace.first_execs.insert(container.to_owned());
        if trace.ready && trace.all_execs_seen() {
            finish(trace, StartOutcome::Ready);
        }
    }

    /// Ends the pod's start trace (if still open) with `outcome`.
    pub fn end_trace(&self, pod_uid: &str, outcome: StartOutcome) {
        if let Some(trace) = self.traces.lock().unwrap().get_mut(pod_uid) {
            finish(trace, outcome);
        }
    }

    /// The pod is `Ready`: the `Ready` event, and the end of the trace once every
    /// container's first exec is in (or [`FIRST_EXEC_WAIT`] passed).
    fn ready(&self, pod_uid: &str) {
        let mut traces = self.traces.lock().unwrap();
        let Some(trace) = traces.get_mut(pod_uid) else { return };
        let Some(root) = &trace.root else { return };
        if trace.ready {
            return;
        }
        trace.ready = true;
        crate::telemetry::add_span_event(root, "Ready", SystemTime::now(), Vec::new());
        let reported = self.first_execs_reported.load(std::sync::atomic::Ordering::Relaxed);
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(runtime) if reported && !trace.all_execs_seen() => {
                let traces = Arc::clone(&self.traces);
                let uid = pod_uid.to_owned();
                runtime.spawn(async move {
                    tokio::time::sleep(FIRST_EXEC_WAIT).await;
                    if let Some(trace) = traces.lock().unwrap().get_mut(&uid) {
                        finish(trace, StartOutcome::Ready);
                    }
                });
            }
            _ => finish(trace, StartOutcome::Ready),
        }
    }

    /// Observes `value` into `histogram`, with the pod's start trace as the exemplar.
    fn observe(&self, histogram: &TracedHistogram, pod_uid: &str, value: f64) {
        let exemplar = self
            .traces
            .lock()
            .unwrap()
            .get(pod_uid)
            .and_then(|t| t.trace_id.clone())
            .map(|trace_id| TraceExemplar { trace_id });
        let when = exemplar.as_ref().map(|_| SystemTime::now());
        histogram.observe(value, exemplar, when);
    }

    /// The pod as the API watch delivered it at `when` (upstream `ObservedPodOnWatch`).
    pub fn observed_on_watch(&self, pod: &Pod, when: SystemTime) {
        let mut pods = self.pods.lock().unwrap();
        if is_terminal(pod.status.as_ref()) {
            pods.remove(pod_uid(pod));
            return;
        }
        let Some(state) = pods.get_mut(pod_uid(pod)) else {
            // Only pods the agent has not started yet (scheduled after it came up).
            if pod.status.as_ref().and_then(|s| s.start_time.as_ref()).is_none() {
                pods.insert(pod_uid(pod).to_string(), PerPod::default());
            }
            return;
        };
        if state.observed_running.is_none() || state.recorded {
            return;
        }
        if pod.status.as_ref().is_some_and(all_containers_started) {
            let created = pod.metadata.creation_timestamp.as_ref().map(|t| SystemTime::from(t.0));
            self.record(pod, state, created.unwrap_or(when), when);
        }
    }

    fn record(&self, pod: &Pod, state: &mut PerPod, created: SystemTime, when: SystemTime) {
        let total = seconds_between(created, when);
        let pulling = match (state.first_started_pulling, state.last_finished_pulling) {
            (Some(a), Some(b)) => seconds_between(a, b).max(0.0),
            _ => 0.0,
        };
        let sli = total - pulling;
        tracing::info!(
            pod = %crate::types::pod::pod_full_name(pod),
            pod_start_slo_duration = sli,
            pod_start_e2e_duration = total,
            "observed pod startup duration"
        );
        self.observe(&self.metrics.pod_start_sli_duration, pod_uid(pod), sli);
        self.observe(&self.metrics.pod_start_total_duration, pod_uid(pod), total);
        state.recorded = true;
    }

    /// An image pull for the pod starts.
    pub fn image_started_pulling(&self, pod_uid: &str) {
        if let Some(s) = self.pods.lock().unwrap().get_mut(pod_uid) {
            s.first_started_pulling.get_or_insert_with(SystemTime::now);
        }
    }

    /// An image pull for the pod ended.
    pub fn image_finished_pulling(&self, pod_uid: &str) {
        if let Some(s) = self.pods.lock().unwrap().get_mut(pod_uid) {
            s.last_finished_pulling = Some(SystemTime::now());
        }
    }

    /// The agent computed `status` for `pod` (upstream `RecordStatusUpdated`); `old` is
    /// the status before, `first_seen` when the agent first saw the pod.
    pub fn status_updated(&self, pod: &Pod, old: Option<&PodStatus>, status: &PodStatus, first_seen: SystemTime) {
        let now = SystemTime::now();
        // kubelet_pod_start_duration_seconds, as SyncPod observes it.
        let was_pending = old.is_none_or(|o| o.phase.as_deref() == Some("Pending"));
        if old.is_none() || was_pending && status.phase.as_deref() == Some("Running") {
            self.observe(&self.metrics.pod_start_duration, pod_uid(pod), seconds_between(first_seen, now).max(0.0));
        }
        if is_ready(status) {
            self.ready(pod_uid(pod));
        } else if is_terminal(Some(status)) {
            self.end_trace(pod_uid(pod), StartOutcome::Terminal);
        }
        let mut pods = self.pods.lock().unwrap();
        let standalone = crate::types::pod::is_static_pod(pod);
        if standalone && old.is_none() && !pods.contains_key(pod_uid(pod)) {
            pods.insert(pod_uid(pod).to_string(), PerPod::default());
        }
        let Some(state) = pods.get_mut(pod_uid(pod)) else { return };
        if state.recorded || state.observed_running.is_some() || !all_containers_started(status) {
            return;
        }
        state.observed_running = Some(now);
        if standalone {
            let created = pod.metadata.creation_timestamp.as_ref().map_or(first_seen, |t| SystemTime::from(t.0));
            self.record(pod, state, created, now);
        }
    }

    /// The pod is gone.
    pub fn forget(&self, pod_uid: &str) {
        self.pods.lock().unwrap().remove(pod_uid);
        self.end_trace(pod_uid, StartOutcome::Gone);
        self.traces.lock().unwrap().remove(pod_uid);
    }

    /// Pods being tracked.
    #[must_use]
    pub fn tracked(&self) -> usize {
        self.pods.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;
    use serde_json::json;

    use super::*;

    /// `_count` and `_sum` of a histogram, from its `OpenMetrics` encoding.
    fn count_sum(h: &TracedHistogram) -> (u64, f64) {
        let text = encode(h);
        let value = |suffix: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("h{suffix} ")))
                .map_or(0.0, |v| v.trim().parse::<f64>().unwrap())
        };
        (value("_count") as u64, value("_sum"))
    }

    fn encode(h: &TracedHistogram) -> String {
        let mut r = Registry::default();
        r.register("h", "", h.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        text
    }

    fn metrics() -> Arc<PodStartupMetrics> {
        Arc::new(PodStartupMetrics::new(&mut Registry::default()))
    }

    fn pod(source: &str, created: Option<&str>) -> Pod {
        let mut v = json!({
            "metadata": {"name": "p", "namespace": "d", "uid": "u1",
                         "annotations": {"kubernetes.io/config.source": source}},
            "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}
        });
        if let Some(c) = created {
            v["metadata"]["creationTimestamp"] = json!(c);
        }
        serde_json::from_value(v).unwrap()
    }

    fn status(phase: &str, running: &[bool]) -> PodStatus {
        let cs: Vec<_> = running
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let state = if *r {
                    json!({"running": {"startedAt": "2026-11-30T10:00:05Z"}})
                } else {
                    json!({"waiting": {"reason": "ContainerCreating"}})
                };
                json!({"name": format!("c{i}"), "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": state})
            })
            .collect();
        serde_json::from_value(json!({"phase": phase, "containerStatuses": cs})).unwrap()
    }

    #[test]
    fn api_pods_are_observed_on_the_watch_once_minus_image_pulls() {
        let m = metrics();
        let t = PodStartupTracker::new(m.clone());
        let p = pod("api", Some("2026-11-30T10:00:00Z"));
        let created = SystemTime::from(p.metadata.creation_timestamp.clone().unwrap().0);
        t.observed_on_watch(&p, created);
        assert_eq!(t.tracked(), 1);
        t.image_started_pulling("u1");
        std::thread::sleep(Duration::from_millis(20));
        t.image_finished_pulling("u1");
        let first_seen = SystemTime::now();
        t.status_updated(&p, None, &status("Pending", &[true, false]), first_seen);
        t.status_updated(&p, Some(&status("Pending", &[true, false])), &status("Running", &[true, true]), first_seen);
        assert_eq!(count_sum(&m.pod_start_duration).0, 2, "first status, then Pending → Running");
        assert_eq!(count_sum(&m.pod_start_sli_duration).0, 0, "not yet seen on the watch");
        let mut watched = p.clone();
        watched.status = Some(status("Running", &[true, true]));
        let when = created + Duration::from_secs(10);
        t.observed_on_watch(&watched, when);
        t.observed_on_watch(&watched, when + Duration::from_secs(1));
        let (total_sum, total_n) = (count_sum(&m.pod_start_total_duration).1, count_sum(&m.pod_start_total_duration).0);
        let (sli_sum, sli_n) = (count_sum(&m.pod_start_sli_duration).1, count_sum(&m.pod_start_sli_duration).0);
        assert_eq!((total_n, sli_n), (1, 1), "observed once");
        assert!((total_sum - 10.0).abs() < 1e-9, "{total_sum}");
        assert!(sli_sum < 10.0 - 0.015 && sli_sum > 9.0, "image pulling excluded: {sli_sum}");
    }

    #[test]
    fn pods_already_started_or_terminal_are_not_tracked() {
        let t = PodStartupTracker::new(metrics());
        let mut started = pod("api", Some("2026-11-30T10:00:00Z"));
        started.status = Some(serde_json::from_value(json!({"startTime": "2026-11-30T10:00:01Z"})).unwrap());
        t.observed_on_watch(&started, SystemTime::now());
        assert_eq!(t.tracked(), 0, "running before the agent started");
        let fresh = pod("api", None);
        t.observed_on_watch(&fresh, SystemTime::now());
        assert_eq!(t.tracked(), 1);
        let mut done = fresh.clone();
        done.status = Some(status("Succeeded", &[false, false]));
        t.observed_on_watch(&done, SystemTime::now());
        assert_eq!(t.tracked(), 0, "terminal pods are forgotten");
    }

    #[test]
    fn static_pods_are_observed_when_their_containers_run() {
        let m = metrics();
        let t = PodStartupTracker::new(m.clone());
        let p = pod("file", None);
        let first_seen = SystemTime::now().checked_sub(Duration::from_secs(3)).unwrap();
        t.status_updated(&p, None, &status("Pending", &[false, false]), first_seen);
        assert_eq!(count_sum(&m.pod_start_sli_duration).0, 0);
        t.status_updated(&p, Some(&status("Pending", &[false, false])), &status("Running", &[true, true]), first_seen);
        t.status_updated(&p, Some(&status("Running", &[true, true])), &status("Running", &[true, true]), first_seen);
        let (sum, n) = (count_sum(&m.pod_start_sli_duration).1, count_sum(&m.pod_start_sli_duration).0);
        assert_eq!(n, 1);
        assert!((3.0..4.0).contains(&sum), "from first sight: {sum}");
        t.forget("u1");
        assert_eq!(t.tracked(), 0);
    }

    fn ready_status() -> PodStatus {
        let mut s = status("Running", &[true, true]);
        s.conditions = Some(vec![serde_json::from_value(json!({"type": "Ready", "status": "True"})).unwrap()]);
        s
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_start_is_one_trace_and_its_id_is_the_exemplar() {
        use crate::telemetry::test_collector::{TestCollector, flush, pipeline, subscriber};
        let (collector, addr) = TestCollector::start().await;
        let telemetry = pipeline(addr, 1_000_000);
        let m = metrics();
        let t = PodStartupTracker::new(m.clone());
        let p = pod("file", None);
        {
            let _subscriber = tracing::subscriber::set_default(subscriber(&telemetry));
            t.begin_trace(&p);
            t.begin_trace(&p); // once per pod
            let root = t.trace_root("u1").expect("an open start trace");
            // A step made elsewhere (the pod worker's syncPod) and parented to the root.
            let sync = crate::telemetry::sync_pod_span("u1", Some(&p), "create");
            crate::telemetry::set_trace_parent(&sync, &root);
            {
                let _sync = sync.enter();
                let _pull = crate::telemetry::pod_step_span("ensureImageExists", "a", "busybox").entered();
            }
            drop(sync);
            drop(root);
            t.first_exec("u1", "a", "id-a", SystemTime::now());
            let first_seen = SystemTime::now();
            t.status_updated(&p, None, &status("Pending", &[false, false]), first_seen);
            t.status_updated(&p, Some(&status("Pending", &[false, false])), &ready_status(), first_seen);
            assert!(t.trace_root("u1").is_none(), "Ready ends the start trace");
        }
        flush(&telemetry);
        let spans = collector.wait_for(3).await;
        let by_name = |n: &str| spans.iter().find(|s| s.name == n).unwrap_or_else(|| panic!("no {n}: {spans:#?}"));
        let (root, sync, pull) = (by_name("podStartup"), by_name("syncPod"), by_name("ensureImageExists"));
        assert!(root.parent_span_id.is_empty(), "the start trace is a root");
        assert_eq!(sync.parent_span_id, root.span_id);
        assert_eq!(pull.parent_span_id, sync.span_id);
        assert!(spans.iter().all(|s| s.trace_id == root.trace_id), "one trace: {spans:#?}");
        assert_eq!(
            root.attributes.get("k8s.pod.start.outcome"),
            Some(&opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue("ready".into()))
        );
        // Both observations of kubelet_pod_start_duration_seconds and the SLI carry the trace.
        for h in [&m.pod_start_duration, &m.pod_start_sli_duration, &m.pod_start_total_duration] {
            let text = encode(h);
            assert!(text.contains(&format!("# {{trace_id=\"{}\"}}", root.trace_id)), "{text}");
        }
    }

    #[test]
    fn start_traces_end_when_the_pod_is_terminal_or_gone() {
        let t = PodStartupTracker::new(metrics());
        let p = pod("file", None);
        t.begin_trace(&p);
        assert!(t.trace_root("u1").is_some());
        t.status_updated(&p, None, &status("Failed", &[false, false]), SystemTime::now());
        assert!(t.trace_root("u1").is_none());
        t.forget("u1");
        t.begin_trace(&p);
        assert!(t.trace_root("u1").is_some(), "a new instance of the pod is a new start");
        t.forget("u1");
        assert!(t.trace_root("u1").is_none());
        let mut deleted = p.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-11-30T10:00:00Z".parse().unwrap()));
        t.begin_trace(&deleted);
        assert!(t.trace_root("u1").is_none(), "no start for a pod being deleted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ready_trace_waits_briefly_for_first_execs_the_sensors_report() {
        let t = PodStartupTracker::new(metrics());
        t.set_first_execs_reported(true);
        let mut p = pod("file", None);
        let ready = ready_status();
        // The last first exec arrives after Ready: it ends the trace.
        t.begin_trace(&p);
        t.first_exec("u1", "a", "id-a", SystemTime::now());
        t.status_updated(&p, None, &ready, SystemTime::now());
        assert!(t.trace_root("u1").is_some(), "b's first exec is still to come");
        t.first_exec("u1", "b", "id-b", SystemTime::now());
        assert!(t.trace_root("u1").is_none());
        // It never arrives: the trace ends after FIRST_EXEC_WAIT.
        p.metadata.uid = Some("u2".into());
        t.begin_trace(&p);
        t.status_updated(&p, None, &ready, SystemTime::now());
        tokio::time::sleep(FIRST_EXEC_WAIT / 2).await;
        assert!(t.trace_root("u2").is_some());
        tokio::time::sleep(FIRST_EXEC_WAIT).await;
        assert!(t.trace_root("u2").is_none());
    }
}
