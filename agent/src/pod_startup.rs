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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use crate::metrics::KubeletMetrics;

#[derive(Debug, Default, Clone)]
struct PerPod {
    first_started_pulling: Option<SystemTime>,
    last_finished_pulling: Option<SystemTime>,
    /// First time the agent computed a status with every container running.
    observed_running: Option<SystemTime>,
    recorded: bool,
}

/// Tracks pod start latency (see the module docs).
#[derive(Debug)]
pub struct PodStartupTracker {
    pods: Mutex<HashMap<String, PerPod>>,
    metrics: Arc<KubeletMetrics>,
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
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

impl PodStartupTracker {
    #[must_use]
    pub fn new(metrics: Arc<KubeletMetrics>) -> Self {
        Self { pods: Mutex::default(), metrics }
    }

    /// The pod as the API watch delivered it at `when` (upstream `ObservedPodOnWatch`).
    pub fn observed_on_watch(&self, pod: &Pod, when: SystemTime) {
        let mut pods = self.pods.lock().unwrap();
        if is_terminal(pod.status.as_ref()) {
            pods.remove(uid(pod));
            return;
        }
        let Some(state) = pods.get_mut(uid(pod)) else {
            // Only pods the agent has not started yet (scheduled after it came up).
            if pod.status.as_ref().and_then(|s| s.start_time.as_ref()).is_none() {
                pods.insert(uid(pod).to_string(), PerPod::default());
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
            pod = %crate::runtime::manager::pod_full_name(pod),
            pod_start_slo_duration = sli,
            pod_start_e2e_duration = total,
            "observed pod startup duration"
        );
        self.metrics.pod_start_sli_duration.observe(sli);
        self.metrics.pod_start_total_duration.observe(total);
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
            self.metrics.pod_start_duration.observe(seconds_between(first_seen, now).max(0.0));
        }
        let mut pods = self.pods.lock().unwrap();
        let standalone = crate::sources::is_static_pod(pod);
        if standalone && old.is_none() && !pods.contains_key(uid(pod)) {
            pods.insert(uid(pod).to_string(), PerPod::default());
        }
        let Some(state) = pods.get_mut(uid(pod)) else { return };
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

    fn metrics() -> Arc<KubeletMetrics> {
        Arc::new(KubeletMetrics::new(&mut Registry::default(), "n"))
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
        assert_eq!(m.pod_start_duration.count(), 2, "first status, then Pending → Running");
        assert_eq!(m.pod_start_sli_duration.count(), 0, "not yet seen on the watch");
        let mut watched = p.clone();
        watched.status = Some(status("Running", &[true, true]));
        let when = created + Duration::from_secs(10);
        t.observed_on_watch(&watched, when);
        t.observed_on_watch(&watched, when + Duration::from_secs(1));
        let (total_sum, total_n) = (m.pod_start_total_duration.sum(), m.pod_start_total_duration.count());
        let (sli_sum, sli_n) = (m.pod_start_sli_duration.sum(), m.pod_start_sli_duration.count());
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
        assert_eq!(m.pod_start_sli_duration.count(), 0);
        t.status_updated(&p, Some(&status("Pending", &[false, false])), &status("Running", &[true, true]), first_seen);
        t.status_updated(&p, Some(&status("Running", &[true, true])), &status("Running", &[true, true]), first_seen);
        let (sum, n) = (m.pod_start_sli_duration.sum(), m.pod_start_sli_duration.count());
        assert_eq!(n, 1);
        assert!((3.0..4.0).contains(&sum), "from first sight: {sum}");
        t.forget("u1");
        assert_eq!(t.tracked(), 0);
    }
}
