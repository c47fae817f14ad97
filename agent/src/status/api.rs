//! [`ApiStatusManager`]: the status manager of API-server mode (`pkg/kubelet/status`).
//! It keeps the latest status of every pod in memory (for `/pods`) and writes it to the
//! API server in the background: only when it changed since the last successful write,
//! with the pod's UID as a precondition, to the mirror pod for static pods. Once a pod
//! with a `deletionTimestamp` has terminated, it deletes the API object with grace 0 —
//! the kubelet's half of graceful deletion.
//!
//! What is left to write is one entry per pod, its latest status (as upstream's status
//! manager keeps one per pod, not a queue of every change): a pod whose status changes
//! a hundred times while the API server is away is written once when it is back. A
//! failed write is retried after a pause that doubles from 1 s up to 10 s, per pod; the
//! deletion of a terminated pod waits for its last status to be written.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::StatusMetrics;
use super::{StatusManager, StatusProvider};
use crate::pod_manager::PodManager;
use crate::types::pod::is_static_pod;

/// The pause before the first retry of a failed write; it doubles with each failure.
pub const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// The longest pause between retries (upstream's status manager retries what it could
/// not write at its 10 s batch sync).
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// How many pods' statuses are written at once. Upstream's status manager writes one pod
/// at a time; in a burst of pod starts on a small node each write waits tens of
/// milliseconds on the loaded API server, and a pod that has just turned `Running` waited
/// behind the `Pending` statuses of the others (the burst rows of README, Performance).
/// One pod's writes stay in order: a pod is in at most one write at a time.
pub const CONCURRENT_WRITES: usize = 8;

/// How often the API's view of each pod is compared with what was written last
/// (upstream's status manager checks `needsReconcile` at its 10 s batch sync).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(10);

/// Whether the pod's status as the API server has it (`api`) contradicts what was written
/// last (`sent`): another phase, or one of the conditions written with another status
/// or missing. Another writer changed it (the node lifecycle controller marks the pods of
/// a node it lost not ready); upstream's `needsReconcile` then writes the status again.
/// Only these fields are compared: the rest is the server's to normalize.
fn contradicts(api: &PodStatus, sent: &PodStatus) -> bool {
    if api.phase != sent.phase {
        return true;
    }
    let theirs = api.conditions.as_deref().unwrap_or_default();
    sent.conditions
        .iter()
        .flatten()
        .any(|ours| theirs.iter().find(|c| c.type_ == ours.type_).is_none_or(|c| c.status != ours.status))
}

/// What is still to be done for one pod: at most one entry per pod, whatever happened
/// since the writer last looked.
#[derive(Debug, Default)]
struct Dirty {
    /// The latest status not yet written: a newer one replaces it.
    status: Option<PodStatus>,
    /// The pod's status was removed here: after `status`, forget what was written last,
    /// so a pod started again under the UID gets its first status written.
    forget: bool,
    /// The pod's worker finished: once its last status is written, the kubelet's half of
    /// graceful deletion (see [`StatusWriter::delete_terminated`]).
    finished: Option<Pod>,
    /// The API object is new (a recreated mirror pod): write `status` even if it is the
    /// one written last.
    rewrite: bool,
    /// When the oldest change not yet written was made: `kubelet_pod_status_sync_duration_seconds`
    /// runs from there to the API having the pod's status, whatever came in between.
    since: Option<Instant>,
}

impl Dirty {
    /// `status` is the latest to write.
    fn set_status(&mut self, status: PodStatus) {
        self.since.get_or_insert_with(Instant::now);
        self.status = Some(status);
    }
}

/// One pod of a batch after its write: what was due, the pod written to, and how the
/// write went (with the resourceVersion it made); no pod and no outcome when nothing
/// needed writing.
struct Written {
    uid: String,
    dirty: Dirty,
    pod: Option<Arc<Pod>>,
    outcome: Option<Result<Option<u64>, kube::Error>>,
}

/// The pods with something to write, shared by the manager and its writer.
#[derive(Debug, Default)]
struct Queue {
    dirty: Mutex<HashMap<String, Dirty>>,
    wake: Notify,
}

impl Queue {
    fn mark(&self, uid: &str, f: impl FnOnce(&mut Dirty)) {
        f(self.dirty.lock().unwrap().entry(uid.to_owned()).or_default());
        self.wake.notify_one();
    }
}

/// Status manager that also writes to the API server.
#[derive(Debug, Clone)]
pub struct ApiStatusManager {
    local: StatusManager,
    queue: Arc<Queue>,
}

/// The background writer; run it with [`StatusWriter::run`].
pub struct StatusWriter {
    client: kube::Client,
    pods: PodManager,
    queue: Arc<Queue>,
    metrics: Arc<StatusMetrics>,
    /// The status last written per pod.
    sent: HashMap<String, PodStatus>,
    /// The pod's resourceVersion that the last write of its status made: a copy of the
    /// pod older than that (a watch behind our own writes, as in a burst of hundreds of
    /// pods) cannot contradict it.
    written_version: HashMap<String, u64>,
    /// Pods whose last write failed: failures in a row, and when to try again.
    retry: HashMap<String, (u32, Instant)>,
}

impl ApiStatusManager {
    #[must_use]
    pub fn new(client: kube::Client, pods: PodManager, metrics: Arc<StatusMetrics>) -> (Self, StatusWriter) {
        let queue = Arc::new(Queue::default());
        let writer = StatusWriter {
            client,
            pods,
            queue: queue.clone(),
            metrics,
            sent: HashMap::new(),
            written_version: HashMap::new(),
            retry: HashMap::new(),
        };
        (Self { local: StatusManager::default(), queue }, writer)
    }
}

impl StatusProvider for ApiStatusManager {
    fn get(&self, uid: &str) -> Option<PodStatus> {
        self.local.get(uid)
    }

    fn phase(&self, uid: &str) -> Option<String> {
        self.local.phase(uid)
    }

    fn set(&self, uid: &str, status: PodStatus) {
        let changed = self.local.get(uid).as_ref() != Some(&status);
        self.local.set(uid, status.clone());
        if changed {
            self.queue.mark(uid, |d| d.set_status(status));
        }
    }

    fn remove(&self, uid: &str) {
        self.local.remove(uid);
        self.queue.mark(uid, |d| d.forget = true);
    }

    fn pod_finished(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.queue.mark(&uid, |d| d.finished = Some(pod.clone()));
    }

    fn mirror_created(&self, uid: &str) {
        if let Some(status) = self.local.get(uid) {
            self.queue.mark(uid, |d| {
                d.set_status(status);
                d.rewrite = true;
            });
        }
    }
}

/// The merge patch that sets `status` on the pod with `uid` (a UID precondition: a pod
/// recreated under the same name must not get the old pod's status).
#[must_use]
pub fn status_patch(uid: Option<&str>, status: &PodStatus) -> serde_json::Value {
    let mut p = serde_json::json!({ "status": status });
    if let Some(uid) = uid {
        p["metadata"] = serde_json::json!({ "uid": uid });
    }
    p
}

/// The pause after `failures` failed writes in a row.
fn retry_after(failures: u32) -> Duration {
    RETRY_INITIAL.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(RETRY_MAX)
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter").finish_non_exhaustive()
    }
}

impl StatusWriter {
    /// Writes statuses until shutdown: each pod's latest, up to [`CONCURRENT_WRITES`]
    /// pods at a time; a pod whose write failed waits out its back-off
    /// ([`RETRY_INITIAL`] doubling up to [`RETRY_MAX`]), its newer statuses replacing
    /// the one that failed.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut next_reconcile = Instant::now() + RECONCILE_PERIOD;
        loop {
            let now = Instant::now();
            if now >= next_reconcile {
                self.reconcile();
                next_reconcile = now + RECONCILE_PERIOD;
            }
            let (ready, next_retry) = {
                let mut dirty = self.queue.dirty.lock().unwrap();
                let waiting = |uid: &String| self.retry.get(uid).map(|(_, at)| *at).filter(|at| *at > now);
                let ready: Vec<String> = dirty.keys().filter(|u| waiting(u).is_none()).cloned().collect();
                let next_retry = dirty.keys().filter_map(waiting).min();
                let ready: Vec<(String, Dirty)> =
                    ready.into_iter().filter_map(|u| dirty.remove(&u).map(|d| (u, d))).collect();
                (ready, next_retry)
            };
            if ready.is_empty() {
                let retry = async {
                    match next_retry {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = self.queue.wake.notified() => {}
                    () = retry => {}
                    () = tokio::time::sleep_until(next_reconcile) => {}
                }
                continue;
            }
            // The writes of the batch at once (each pod once in it), then what each
            // outcome leaves to do, in turn.
            let (this, stopping) = (&self, &shutdown);
            let written: Vec<Written> = futures::stream::iter(ready)
                .map(|(uid, dirty)| async move {
                    let pod = dirty
                        .status
                        .as_ref()
                        .filter(|status| dirty.rewrite || this.sent.get(&uid) != Some(status))
                        .and_then(|_| this.pods.shared(&uid));
                    let outcome = match (&pod, &dirty.status) {
                        (Some(pod), Some(status)) if !stopping.is_cancelled() => Some(this.write(pod, status).await),
                        _ => None,
                    };
                    Written { uid, dirty, pod, outcome }
                })
                .buffer_unordered(CONCURRENT_WRITES)
                .collect()
                .await;
            for w in written {
                if shutdown.is_cancelled() {
                    return;
                }
                self.settle(w).await;
            }
        }
    }

    /// Queues again the last written status of every API pod whose status on the API
    /// server [`contradicts`] it. Static pods are left out: their API object is the
    /// mirror pod, whose status the pod manager does not keep.
    fn reconcile(&self) {
        for (uid, sent) in &self.sent {
            // Every 10 s for every pod written: shared, not copied.
            let Some(pod) = self.pods.shared(uid) else { continue };
            if is_static_pod(&pod) || !pod.status.as_ref().is_some_and(|api| contradicts(api, sent)) {
                continue;
            }
            // resourceVersions are opaque to clients, but the API server's are etcd's
            // revisions: where both are numbers, an older copy is just late.
            let version = pod.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
            if let (Some(seen), Some(&written)) = (version, self.written_version.get(uid))
                && seen < written
            {
                continue;
            }
            tracing::info!(
                pod = %crate::types::pod::pod_full_name(&pod),
                "pod status on the API server differs from the last one written; writing it again"
            );
            self.queue.mark(uid, |d| {
                if d.status.is_none() {
                    d.set_status(sent.clone());
                }
                d.rewrite = true;
            });
        }
    }

    /// Does what is left for one pod after its write (if it needed one): a failed write
    /// goes back in the queue (unless a newer status is there already) with the pod's
    /// back-off.
    async fn settle(&mut self, written: Written) {
        let Written { uid, dirty: Dirty { status, forget, finished, rewrite, since }, pod, outcome } = written;
        if let Some(status) = status
            && let Some(pod) = pod
            && let Some(outcome) = outcome
        {
            match outcome {
                Ok(version) => {
                    let took = since.map_or(Duration::ZERO, |since| since.elapsed());
                    self.metrics.pod_status_sync_duration.observe(took.as_secs_f64());
                    match version {
                        Some(v) => self.written_version.insert(uid.clone(), v),
                        None => self.written_version.remove(&uid),
                    };
                    self.sent.insert(uid.clone(), status);
                }
                Err(e) => {
                    let failures = self.retry.get(&uid).map_or(0, |(n, _)| *n) + 1;
                    let pause = retry_after(failures);
                    tracing::warn!(
                        pod = %crate::types::pod::pod_full_name(&pod),
                        error = %e,
                        retry_in = ?pause,
                        "pod status update failed"
                    );
                    self.retry.insert(uid.clone(), (failures, Instant::now() + pause));
                    let mut queue = self.queue.dirty.lock().unwrap();
                    let again = queue.entry(uid).or_default();
                    again.status.get_or_insert(status);
                    // A newer status waits since the change the failed one was for.
                    again.since = match (again.since, since) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    again.forget |= forget;
                    again.rewrite |= rewrite;
                    if again.finished.is_none() {
                        again.finished = finished;
                    }
                    return;
                }
            }
        }
        self.retry.remove(&uid);
        if forget {
            self.sent.remove(&uid);
            self.written_version.remove(&uid);
        }
        if let Some(pod) = finished {
            self.delete_terminated(&pod).await;
        }
    }

    /// Writes `status`; returns the pod's resourceVersion after the write when it is a
    /// number (`None` too when there was no object to write to).
    async fn write(&self, pod: &Pod, status: &PodStatus) -> Result<Option<u64>, kube::Error> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        // Static pods report through their mirror pod, whose UID differs.
        let uid = if is_static_pod(pod) { None } else { pod.metadata.uid.as_deref() };
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status_patch(uid, status))).await {
            Ok(written) => Ok(written.metadata.resource_version.and_then(|v| v.parse().ok())),
            // A static pod's mirror may not exist yet: try again until it does.
            Err(e @ kube::Error::Api(_)) if is_static_pod(pod) => Err(e),
            // An API pod that is gone has no status to write.
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The kubelet's last word on a deleted pod: remove the API object (grace 0).
    async fn delete_terminated(&self, pod: &Pod) {
        if is_static_pod(pod) || pod.metadata.deletion_timestamp.is_none() {
            return;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: pod.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "deleted terminated pod from the API"),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "failed to delete terminated pod"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http_body_util::BodyExt as _;

    use super::*;
    use crate::sources::PodUpdate;

    /// A fake API server at the transport: answers every request with `code` (the test
    /// changes it) and records the patches' `status.message` (`DELETE` for a deletion).
    #[derive(Clone, Default)]
    struct FakeApi {
        code: Arc<Mutex<u16>>,
        patches: Arc<Mutex<Vec<(u16, String)>>>,
        /// Requests being answered, the most at once so far, and how many must have been
        /// in flight at once before any is answered (each waits at most 1 s; 0: none).
        in_flight: Arc<AtomicUsize>,
        max_in_flight: Arc<AtomicUsize>,
        gather: usize,
        arrived: Arc<Notify>,
    }

    impl FakeApi {
        fn client(&self) -> kube::Client {
            let api = self.clone();
            let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let api = api.clone();
                async move {
                    let now = api.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    api.max_in_flight.fetch_max(now, Ordering::SeqCst);
                    api.arrived.notify_waiters();
                    let gathered = async {
                        while api.max_in_flight.load(Ordering::SeqCst) < api.gather {
                            let arrival = api.arrived.notified();
                            tokio::pin!(arrival);
                            arrival.as_mut().enable();
                            if api.max_in_flight.load(Ordering::SeqCst) >= api.gather {
                                break;
                            }
                            arrival.await;
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(1), gathered).await;
                    api.in_flight.fetch_sub(1, Ordering::SeqCst);
                    let delete = req.method() == http::Method::DELETE;
                    let body = req.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
                    let patch: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    let message = if delete {
                        "DELETE".to_owned()
                    } else {
                        patch["status"]["message"].as_str().unwrap_or_default().to_owned()
                    };
                    let code = *api.code.lock().unwrap();
                    let mut patches = api.patches.lock().unwrap();
                    patches.push((code, message));
                    // etcd's revision moves on with every write: 101, 102, ...
                    let version = (100 + patches.len()).to_string();
                    drop(patches);
                    let answer = if code == 200 {
                        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                                           "metadata": {"name": "p", "namespace": "default", "resourceVersion": version}})
                    } else {
                        serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                           "message": "unavailable", "reason": "ServiceUnavailable", "code": code})
                    };
                    Ok::<_, String>(
                        http::Response::builder()
                            .status(code)
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(serde_json::to_vec(&answer).unwrap()))
                            .unwrap(),
                    )
                }
            });
            kube::client::ClientBuilder::new(service, "default").build()
        }

        fn patches(&self) -> Vec<(u16, String)> {
            self.patches.lock().unwrap().clone()
        }
    }

    fn api_pod(deleted: bool) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"}
        }))
        .unwrap();
        if deleted {
            pod.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        }
        pod
    }

    fn status(message: &str) -> PodStatus {
        PodStatus { phase: Some("Running".into()), message: Some(message.into()), ..Default::default() }
    }

    /// The API pod with our status and its `Ready` condition `ready`, at `version`.
    fn with_ready_at(ready: &str, version: Option<&str>) -> Pod {
        let mut pod = api_pod(false);
        pod.metadata.resource_version = version.map(str::to_owned);
        let mut st = status("ours");
        st.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: ready.into(),
            ..Default::default()
        }]);
        pod.status = Some(st);
        pod
    }

    /// A status writer running against `api`, with `pod` the desired one.
    struct Running {
        manager: ApiStatusManager,
        pods: PodManager,
        registry: prometheus_client::registry::Registry,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Running {
        /// Sets `api` to answer `code`, then starts the writer.
        fn start(api: &FakeApi, code: u16, pod: Pod) -> Self {
            *api.code.lock().unwrap() = code;
            let pods = PodManager::new(&["api"]);
            pods.apply(PodUpdate::set("api", [pod]));
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = Arc::new(StatusMetrics::new(&mut registry));
            let (manager, writer) = ApiStatusManager::new(api.client(), pods.clone(), metrics);
            let stop = CancellationToken::new();
            let task = tokio::spawn(writer.run(stop.clone()));
            Self { manager, pods, registry, stop, task }
        }

        /// The writer's metrics in the text format.
        fn metrics_text(&self) -> String {
            let mut out = String::new();
            prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).unwrap();
            out
        }

        /// Sets the status of pod `u1`, then lets `wait` pass.
        async fn set(&self, status: PodStatus, wait: Duration) {
            self.manager.set("u1", status);
            tokio::time::sleep(wait).await;
        }

        async fn stop(self) {
            self.stop.cancel();
            self.task.await.unwrap();
        }
    }

    /// While the API server fails, a pod's status is retried with a growing pause, however
    /// often it changes meanwhile; once the server is back, only the latest is written.
    #[tokio::test(start_paused = true)]
    async fn failed_writes_back_off_and_the_latest_status_wins() {
        let api = FakeApi::default();
        let running = Running::start(&api, 503, api_pod(false));
        for n in 1..=5 {
            running.set(status(&format!("s{n}")), Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_mins(1)).await;
        let failed = api.patches().len();
        // 1, 2, 4, 8 and then every 10 s: 9 or 10 attempts in the minute, not one a
        // second per status set.
        assert!(failed <= 12, "{failed} attempts in a minute of failures");
        *api.code.lock().unwrap() = 200;
        tokio::time::sleep(Duration::from_secs(11)).await;
        let written: Vec<String> =
            api.patches().into_iter().filter(|(code, _)| *code == 200).map(|(_, message)| message).collect();
        assert_eq!(written, vec!["s5".to_string()]);
        running.stop().await;
    }

    /// `kubelet_pod_status_sync_duration_seconds` as upstream defines it: from the first
    /// status change not yet written to the API having it, the failed attempts and the
    /// changes in between included (not one request's round trip), in upstream's buckets.
    #[tokio::test(start_paused = true)]
    async fn the_status_sync_duration_runs_from_the_change_to_the_api_having_it() {
        let api = FakeApi::default();
        let running = Running::start(&api, 503, api_pod(false));
        running.set(status("s1"), Duration::from_millis(300)).await;
        running.set(status("s2"), Duration::from_millis(300)).await;
        *api.code.lock().unwrap() = 200;
        // The retry, a second after the failure.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(api.patches(), vec![(503, "s1".to_string()), (200, "s2".to_string())]);
        let text = running.metrics_text();
        let sample = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        assert!(text.contains("\nkubelet_pod_status_sync_duration_seconds_count 1\n"), "{text}");
        let took = sample("kubelet_pod_status_sync_duration_seconds_sum");
        assert!((1.0..1.1).contains(&took), "from s1's change to s2 written: {took} s");
        let buckets: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("kubelet_pod_status_sync_duration_seconds_bucket{le=\""))
            .filter_map(|l| l.split('"').next())
            .collect();
        assert_eq!(
            buckets,
            ["0.01", "0.05", "0.1", "0.5", "1.0", "5.0", "10.0", "20.0", "30.0", "45.0", "60.0", "+Inf"]
        );
        running.stop().await;
    }

    /// In a burst of pod starts the statuses of several pods are written at once, not one
    /// pod after the other behind the API server's latency: the fake API holds each
    /// request until [`CONCURRENT_WRITES`] are in flight (or a second passed).
    #[tokio::test(start_paused = true)]
    async fn statuses_of_a_burst_are_written_several_pods_at_a_time() {
        let api = FakeApi { gather: CONCURRENT_WRITES, ..FakeApi::default() };
        *api.code.lock().unwrap() = 200;
        let count = 2 * CONCURRENT_WRITES;
        let pods = PodManager::new(&["api"]);
        let burst = (0..count).map(|i| {
            serde_json::from_value::<Pod>(serde_json::json!({
                "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("u{i}")}
            }))
            .unwrap()
        });
        pods.apply(PodUpdate::set("api", burst));
        let (manager, writer) = ApiStatusManager::new(api.client(), pods, Arc::new(StatusMetrics::default()));
        for i in 0..count {
            manager.set(&format!("u{i}"), status(&format!("s{i}")));
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(writer.run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut written: Vec<String> = api.patches().into_iter().map(|(_, message)| message).collect();
        written.sort();
        let mut expected: Vec<String> = (0..count).map(|i| format!("s{i}")).collect();
        expected.sort();
        assert_eq!(written, expected, "each pod's status once, within half a second");
        assert_eq!(api.max_in_flight.load(Ordering::SeqCst), CONCURRENT_WRITES);
        stop.cancel();
        task.await.unwrap();
    }

    /// A deleted pod's object goes (grace 0) only once its last status is written, and
    /// what was written is forgotten with the pod: the same status is written again
    /// for a pod started anew under the UID.
    #[tokio::test(start_paused = true)]
    async fn a_terminated_pod_is_deleted_after_its_last_status() {
        let api = FakeApi::default();
        let running = Running::start(&api, 503, api_pod(true));
        running.manager.set("u1", status("final"));
        running.manager.remove("u1");
        running.manager.pod_finished(&api_pod(true));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(api.patches(), vec![(503, "final".to_string())], "no deletion before the last status");
        *api.code.lock().unwrap() = 200;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after: Vec<String> = api.patches().into_iter().skip(1).map(|(_, m)| m).collect();
        assert_eq!(after, vec!["final".to_string(), "DELETE".to_string()]);
        running.set(status("final"), Duration::from_millis(100)).await;
        assert_eq!(api.patches().last().map(|(_, m)| m.as_str()), Some("final"), "written again");
        running.stop().await;
    }

    /// Upstream's needsReconcile: the node lifecycle controller marks the pods of a node
    /// it lost not ready; once the API's status contradicts the one written last, the
    /// writer writes it again at its next reconciliation — and not while they agree.
    #[tokio::test(start_paused = true)]
    async fn a_status_another_writer_changed_is_written_again() {
        let api = FakeApi::default();
        let with_ready = |ready: &str| with_ready_at(ready, None);
        let running = Running::start(&api, 200, with_ready("True"));
        running.set(with_ready("True").status.unwrap(), Duration::from_secs(35)).await;
        assert_eq!(api.patches().len(), 1, "agreeing statuses are not written again");
        running.pods.apply(PodUpdate::set("api", [with_ready("False")]));
        tokio::time::sleep(RECONCILE_PERIOD + Duration::from_millis(100)).await;
        assert_eq!(api.patches().len(), 2, "the contradicted status is written again");
        running.stop().await;
    }

    /// Found at 500 pods on the real control plane: in a burst the pod watch runs seconds
    /// behind the agent's own writes, and each reconciliation took hundreds of pods'
    /// older copies for contradictions and wrote them again. A copy older than the write
    /// is late, not contradicting; a newer one is another writer's.
    #[tokio::test(start_paused = true)]
    async fn a_copy_older_than_the_last_write_is_not_a_contradiction() {
        let api = FakeApi::default();
        let with = |ready: &str, version: &str| with_ready_at(ready, Some(version));
        let running = Running::start(&api, 200, with("False", "50"));
        // Written: the API server answers resourceVersion 101.
        running.set(with("True", "0").status.unwrap(), Duration::from_millis(100)).await;
        assert_eq!(api.patches().len(), 1);
        // The watch still shows the copy before the write.
        running.pods.apply(PodUpdate::set("api", [with("False", "60")]));
        tokio::time::sleep(2 * RECONCILE_PERIOD).await;
        assert_eq!(api.patches().len(), 1, "a late copy made the writer write again");
        // Another writer changed it after our write.
        running.pods.apply(PodUpdate::set("api", [with("False", "102")]));
        tokio::time::sleep(RECONCILE_PERIOD + Duration::from_millis(100)).await;
        assert_eq!(api.patches().len(), 2, "the contradicted status is written again");
        running.stop().await;
    }

    /// Found on the real control plane: a mirror pod deleted through the API came back
    /// `Pending` for good, because its unchanged status was never written to the new
    /// object. A recreated mirror gets the status again.
    #[tokio::test(start_paused = true)]
    async fn a_recreated_mirror_pod_gets_the_unchanged_status_again() {
        let api = FakeApi::default();
        let running = Running::start(&api, 200, api_pod(false));
        running.set(status("up"), Duration::from_millis(100)).await;
        // Unchanged: nothing more to write.
        running.set(status("up"), Duration::from_millis(100)).await;
        assert_eq!(api.patches().len(), 1);
        running.manager.mirror_created("u1");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(api.patches(), vec![(200, "up".to_string()), (200, "up".to_string())], "written again");
        // A pod with no status yet: nothing to write.
        running.manager.mirror_created("unknown");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(api.patches().len(), 2);
        running.stop().await;
    }
}
