//! Worker and manager tests on tokio's paused clock with a scripted runner.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    ExecAction, ObjectReference, Pod, PodSpec, PodStatus, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;
use crate::events::{EventRecorder, EventType};

// ---------------------------------------------------------------- fakes

#[derive(Clone, Debug)]
struct Call {
    /// Since the test started.
    at: Duration,
    probe_type: ProbeType,
    container: String,
    container_id: String,
    timeout_seconds: Option<i32>,
    period_seconds: Option<i32>,
}

/// Answers with a per-(container, type) script, then a per-(container, type) default,
/// then success.
#[derive(Debug)]
struct FakeRunner {
    t0: Instant,
    script: Mutex<HashMap<(String, ProbeType), VecDeque<ProbeOutcome>>>,
    default: Mutex<HashMap<(String, ProbeType), ProbeOutcome>>,
    calls: Mutex<Vec<Call>>,
}

impl FakeRunner {
    fn new() -> Self {
        Self { t0: Instant::now(), script: Mutex::default(), default: Mutex::default(), calls: Mutex::default() }
    }

    fn set(&self, container: &str, t: ProbeType, o: ProbeOutcome) {
        self.default.lock().unwrap().insert((container.into(), t), o);
    }

    fn script(&self, container: &str, t: ProbeType, outcomes: Vec<ProbeOutcome>) {
        self.script.lock().unwrap().insert((container.into(), t), outcomes.into());
    }

    fn calls(&self, container: &str, t: ProbeType) -> Vec<Call> {
        self.calls.lock().unwrap().iter().filter(|c| c.container == container && c.probe_type == t).cloned().collect()
    }

    fn times(&self, container: &str, t: ProbeType) -> Vec<Duration> {
        self.calls(container, t).iter().map(|c| c.at).collect()
    }

    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

#[async_trait::async_trait]
impl ProbeRunner for FakeRunner {
    async fn run(
        &self,
        probe_type: ProbeType,
        _pod: &Pod,
        _status: &PodStatus,
        container: &Container,
        container_id: &str,
        probe: &Probe,
    ) -> ProbeOutcome {
        self.calls.lock().unwrap().push(Call {
            at: self.t0.elapsed(),
            probe_type,
            container: container.name.clone(),
            container_id: container_id.to_string(),
            timeout_seconds: probe.timeout_seconds,
            period_seconds: probe.period_seconds,
        });
        let key = (container.name.clone(), probe_type);
        if let Some(o) = self.script.lock().unwrap().get_mut(&key).and_then(VecDeque::pop_front) {
            return o;
        }
        self.default.lock().unwrap().get(&key).cloned().unwrap_or_else(|| ProbeOutcome::success(""))
    }
}

/// (type, reason, message, field path).
type RecordedEvent = (EventType, String, String, Option<String>);

#[derive(Debug, Default)]
struct FakeRecorder {
    events: Mutex<Vec<RecordedEvent>>,
}

impl EventRecorder for FakeRecorder {
    fn record(&self, object: ObjectReference, type_: EventType, reason: &str, message: String) {
        self.events.lock().unwrap().push((type_, reason.to_string(), message, object.field_path));
    }
}

impl FakeRecorder {
    fn with_reason(&self, reason: &str) -> Vec<(EventType, String, Option<String>)> {
        self.events.lock().unwrap().iter().filter(|e| e.1 == reason).map(|e| (e.0, e.2.clone(), e.3.clone())).collect()
    }
}

struct Harness {
    mgr: ProbeManager,
    runner: Arc<FakeRunner>,
    events: Arc<FakeRecorder>,
    metrics: Arc<ProberMetrics>,
    updates: mpsc::UnboundedReceiver<ProbeUpdate>,
}

impl Harness {
    fn new(jitter: fn() -> f64) -> Self {
        let runner = Arc::new(FakeRunner::new());
        let events = Arc::new(FakeRecorder::default());
        let metrics = Arc::new(ProberMetrics::new());
        let mgr = ProbeManager::with_jitter(runner.clone(), events.clone(), metrics.clone(), jitter);
        let updates = mgr.take_updates().expect("first take");
        Self { mgr, runner, events, metrics, updates }
    }

    /// Jitter 0: a worker's first probe is at once.
    fn immediate() -> Self {
        Self::new(|| 0.0)
    }

    fn drain(&mut self) -> Vec<ProbeUpdate> {
        let mut out = Vec::new();
        while let Ok(u) = self.updates.try_recv() {
            out.push(u);
        }
        out
    }

    /// `(probe_type, result)` of the drained updates.
    fn drain_results(&mut self) -> Vec<(ProbeType, ProbeResult)> {
        self.drain().into_iter().map(|u| (u.probe_type, u.result)).collect()
    }

    /// A container that started `ago` before now.
    fn started(&self, ago: Duration) -> Time {
        Time(self.mgr.now() - SignedDuration::try_from(ago).unwrap())
    }
}

/// Lets the woken tasks run without moving the clock.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Moves the paused clock forward, firing every timer due on the way in order.
async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
    settle().await;
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn ms(d: &[Duration]) -> Vec<u128> {
    d.iter().map(Duration::as_millis).collect()
}

// ---------------------------------------------------------------- builders

fn probe(period: i32) -> Probe {
    Probe {
        exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
        period_seconds: Some(period),
        ..Default::default()
    }
}

fn thresholds(mut p: Probe, success: i32, failure: i32) -> Probe {
    p.success_threshold = Some(success);
    p.failure_threshold = Some(failure);
    p
}

fn container(name: &str) -> Container {
    Container { name: name.into(), image: Some("img".into()), ..Default::default() }
}

fn with_probes(
    mut c: Container,
    startup: Option<Probe>,
    readiness: Option<Probe>,
    liveness: Option<Probe>,
) -> Container {
    c.startup_probe = startup;
    c.readiness_probe = readiness;
    c.liveness_probe = liveness;
    c
}

fn sidecar(c: Container) -> Container {
    Container { restart_policy: Some("Always".into()), ..c }
}

fn pod(uid: &str, containers: Vec<Container>, init: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{uid}")),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            init_containers: (!init.is_empty()).then_some(init),
            restart_policy: Some("Always".into()),
            termination_grace_period_seconds: Some(30),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn with_restart_policy(mut p: Pod, policy: &str) -> Pod {
    p.spec.as_mut().unwrap().restart_policy = Some(policy.into());
    p
}

fn running(name: &str, id: &str, started_at: Time) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        container_id: Some(format!("containerd://{id}")),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning { started_at: Some(started_at) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn terminated(name: &str, id: &str, exit_code: i32) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        container_id: Some(format!("containerd://{id}")),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated { exit_code, ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn waiting(name: &str, id: Option<&str>) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        container_id: id.map(|i| format!("containerd://{i}")),
        state: Some(ContainerState { waiting: Some(ContainerStateWaiting::default()), ..Default::default() }),
        ..Default::default()
    }
}

fn status(containers: Vec<ContainerStatus>, init: Vec<ContainerStatus>) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(containers),
        init_container_statuses: (!init.is_empty()).then_some(init),
        ..Default::default()
    }
}

const LONG_AGO: Duration = Duration::from_hours(1);

// ---------------------------------------------------------------- timing

#[tokio::test(start_paused = true)]
async fn first_probe_is_jittered_then_periodic() {
    let h = Harness::new(|| 0.25);
    let p = pod("u", vec![with_probes(container("c"), None, Some(probe(10)), None)], vec![]);
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(30.0)).await;
    assert_eq!(ms(&h.runner.times("c", ProbeType::Readiness)), vec![2500, 12500, 22500]);
}

#[tokio::test(start_paused = true)]
async fn random_jitter_stays_within_one_period() {
    let runner = Arc::new(FakeRunner::new());
    let mgr = ProbeManager::new(runner.clone(), Arc::new(FakeRecorder::default()), Arc::new(ProberMetrics::new()));
    let p = pod("u", vec![with_probes(container("c"), None, None, Some(probe(10)))], vec![]);
    let started = Time(mgr.now() - SignedDuration::from_hours(1));
    mgr.set_pod_status("u", &status(vec![running("c", "a", started)], vec![]));
    mgr.add_pod(&p);
    advance(secs(9.999)).await;
    let first = runner.times("c", ProbeType::Liveness);
    assert_eq!(first.len(), 1, "exactly one probe within the first period");
    assert!(first[0] < secs(10.0));
    advance(secs(10.0)).await;
    let times = runner.times("c", ProbeType::Liveness);
    assert_eq!(times.len(), 2);
    assert_eq!(times[1].checked_sub(times[0]), Some(secs(10.0)));
}

#[tokio::test(start_paused = true)]
async fn no_jitter_once_the_agent_has_run_for_a_period() {
    let h = Harness::new(|| 0.9);
    advance(secs(60.0)).await;
    let p = pod("u", vec![with_probes(container("c"), None, Some(probe(10)), None)], vec![]);
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(15.0)).await;
    assert_eq!(ms(&h.runner.times("c", ProbeType::Readiness)), vec![60000, 70000]);
}

#[tokio::test(start_paused = true)]
async fn initial_delay_counts_from_started_at() {
    let h = Harness::immediate();
    let mut pr = probe(2);
    pr.initial_delay_seconds = Some(5);
    let p = pod("u", vec![with_probes(container("c"), None, None, Some(pr.clone()))], vec![]);
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(Duration::ZERO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(4.5)).await;
    assert!(h.runner.times("c", ProbeType::Liveness).is_empty(), "ticks at 0, 2 and 4 s are inside the delay");
    advance(secs(4.0)).await;
    assert_eq!(ms(&h.runner.times("c", ProbeType::Liveness)), vec![6000, 8000]);

    // A container that started long ago is probed at once.
    let p2 = pod("v", vec![with_probes(container("c"), None, None, Some(pr))], vec![]);
    h.mgr.set_pod_status("v", &status(vec![running("c", "b", h.started(secs(100.0)))], vec![]));
    h.mgr.add_pod(&p2);
    settle().await;
    assert_eq!(h.runner.calls("c", ProbeType::Liveness).last().unwrap().container_id, "b");
}

#[tokio::test(start_paused = true)]
async fn timeout_and_defaults_are_passed_through() {
    let h = Harness::immediate();
    let mut with_timeout = probe(3);
    with_timeout.timeout_seconds = Some(7);
    let bare = Probe { exec: Some(ExecAction::default()), ..Default::default() };
    let p = pod(
        "u",
        vec![
            with_probes(container("a"), None, None, Some(with_timeout)),
            with_probes(container("b"), None, None, Some(bare)),
        ],
        vec![],
    );
    h.mgr.set_pod_status(
        "u",
        &status(vec![running("a", "ida", h.started(LONG_AGO)), running("b", "idb", h.started(LONG_AGO))], vec![]),
    );
    h.mgr.add_pod(&p);
    advance(secs(10.5)).await;
    let a = h.runner.calls("a", ProbeType::Liveness);
    assert_eq!(a[0].timeout_seconds, Some(7));
    assert_eq!(a[0].container_id, "ida", "the runner gets the bare runtime id");
    let b = h.runner.calls("b", ProbeType::Liveness);
    assert_eq!((b[0].timeout_seconds, b[0].period_seconds), (Some(1), Some(10)), "API defaults");
    assert_eq!(ms(&b.iter().map(|c| c.at).collect::<Vec<_>>()), vec![0, 10000]);
}

// ---------------------------------------------------------------- thresholds

#[tokio::test(start_paused = true)]
async fn liveness_failure_threshold_then_on_hold_until_restart() {
    let mut h = Harness::immediate();
    let mut pr = thresholds(probe(1), 1, 3);
    pr.termination_grace_period_seconds = Some(5);
    let p = pod("u", vec![with_probes(container("c"), None, None, Some(pr))], vec![]);
    h.runner.set("c", ProbeType::Liveness, ProbeOutcome::failure("boom"));
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);

    // Failures at 0 and 1 s: below the threshold, the initial Success stands.
    advance(secs(1.5)).await;
    assert_eq!(h.runner.times("c", ProbeType::Liveness).len(), 2);
    assert_eq!(h.mgr.liveness().get("containerd://a"), Some(ProbeResult::Success));
    assert_eq!(h.drain_results(), vec![(ProbeType::Liveness, ProbeResult::Success)]);
    assert!(h.mgr.container_to_kill(&p, "c", "containerd://a").is_none());

    // The third one is the verdict.
    advance(secs(1.0)).await;
    assert_eq!(h.mgr.liveness().get("containerd://a"), Some(ProbeResult::Failure));
    let u = h.drain();
    assert_eq!(u.len(), 1);
    assert_eq!(
        u[0],
        ProbeUpdate {
            pod_uid: "u".into(),
            container_name: "c".into(),
            container_id: "containerd://a".into(),
            probe_type: ProbeType::Liveness,
            result: ProbeResult::Failure,
            termination_grace_period_seconds: Some(5),
        }
    );
    let kill = h.mgr.container_to_kill(&p, "c", "containerd://a").unwrap();
    assert_eq!(kill.message, "Container c failed liveness probe, will be restarted");
    assert_eq!((kill.probe_type, kill.grace_period_seconds, kill.restart), (ProbeType::Liveness, 5, true));

    let unhealthy = h.events.with_reason("Unhealthy");
    assert_eq!(unhealthy.len(), 3, "one event per failed probe");
    assert_eq!(
        unhealthy[0],
        (EventType::Warning, "Liveness probe failed: boom".to_string(), Some("spec.containers{c}".to_string()))
    );

    // On hold: no probing while the same container is there.
    advance(secs(10.0)).await;
    assert_eq!(h.runner.times("c", ProbeType::Liveness).len(), 3);

    // The restarted container is probed again, from the initial value.
    h.mgr.set_pod_status("u", &status(vec![running("c", "b", h.started(Duration::ZERO))], vec![]));
    advance(secs(1.0)).await;
    assert_eq!(h.runner.calls("c", ProbeType::Liveness).last().unwrap().container_id, "b");
    assert_eq!(h.mgr.liveness().get("containerd://a"), None, "the old container is forgotten");
    assert_eq!(h.mgr.liveness().get("containerd://b"), Some(ProbeResult::Success));
    assert_eq!(h.drain_results(), vec![(ProbeType::Liveness, ProbeResult::Success)]);
}

#[tokio::test(start_paused = true)]
async fn a_new_container_needs_the_full_failure_threshold() {
    let mut h = Harness::immediate();
    let p = pod("u", vec![with_probes(container("c"), None, None, Some(thresholds(probe(1), 1, 3)))], vec![]);
    h.runner.set("c", ProbeType::Liveness, ProbeOutcome::failure("x"));
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(1.5)).await; // two failures on "a"
    h.mgr.set_pod_status("u", &status(vec![running("c", "b", h.started(LONG_AGO))], vec![]));
    advance(secs(1.0)).await; // first failure on "b"
    advance(secs(1.0)).await; // second
    assert_eq!(h.mgr.liveness().get("containerd://b"), Some(ProbeResult::Success));
    advance(secs(1.0)).await; // third
    assert_eq!(h.mgr.liveness().get("containerd://b"), Some(ProbeResult::Failure));
    let results = h.drain_results();
    assert_eq!(results.last(), Some(&(ProbeType::Liveness, ProbeResult::Failure)));
    assert_eq!(results.iter().filter(|r| r.1 == ProbeResult::Failure).count(), 1);
}

#[tokio::test(start_paused = true)]
async fn readiness_thresholds_flip_both_ways() {
    let mut h = Harness::immediate();
    let p = pod("u", vec![with_probes(container("c"), None, Some(thresholds(probe(1), 2, 2)), None)], vec![]);
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    let ready = |h: &Harness| {
        let mut s = status(vec![running("c", "a", h.started(LONG_AGO))], vec![]);
        h.mgr.update_pod_status(&p, &mut s);
        s.container_statuses.unwrap()[0].ready
    };

    settle().await; // success 1 of 2
    assert_eq!(h.mgr.readiness().get("containerd://a"), Some(ProbeResult::Failure));
    assert_eq!(h.drain_results(), vec![(ProbeType::Readiness, ProbeResult::Failure)]);
    advance(secs(1.0)).await; // success 2 of 2
    assert_eq!(h.drain_results(), vec![(ProbeType::Readiness, ProbeResult::Success)]);
    assert!(ready(&h));

    h.runner.set("c", ProbeType::Readiness, ProbeOutcome::failure("nope"));
    advance(secs(1.0)).await; // failure 1 of 2
    assert!(ready(&h));
    assert!(h.drain_results().is_empty());
    advance(secs(1.0)).await; // failure 2 of 2
    assert!(!ready(&h));
    assert_eq!(h.drain_results(), vec![(ProbeType::Readiness, ProbeResult::Failure)]);
    // Asking for readiness while not ready runs the probe at once (still failing).
    settle().await;
    assert_eq!(ms(&h.runner.times("c", ProbeType::Readiness)), vec![0, 1000, 2000, 3000, 3000]);

    h.runner.set("c", ProbeType::Readiness, ProbeOutcome::success(""));
    advance(secs(1.0)).await;
    assert!(h.drain_results().is_empty());
    advance(secs(1.0)).await;
    assert_eq!(h.drain_results(), vec![(ProbeType::Readiness, ProbeResult::Success)]);
    assert!(ready(&h));
    // Readiness keeps probing throughout, one period after the manual run.
    assert_eq!(ms(&h.runner.times("c", ProbeType::Readiness)), vec![0, 1000, 2000, 3000, 3000, 4000, 5000]);
}

#[tokio::test(start_paused = true)]
async fn errors_are_retried_and_do_not_count() {
    let mut h = Harness::immediate();
    let p = pod("u", vec![with_probes(container("c"), None, None, Some(thresholds(probe(1), 1, 1)))], vec![]);
    h.runner.set("c", ProbeType::Liveness, ProbeOutcome::error("exec failed"));
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(2.5)).await;
    assert_eq!(h.runner.times("c", ProbeType::Liveness).len(), 9, "three attempts per tick");
    assert_eq!(h.mgr.liveness().get("containerd://a"), Some(ProbeResult::Success));
    assert_eq!(h.drain_results(), vec![(ProbeType::Liveness, ProbeResult::Success)]);
    let ev = h.events.with_reason("Unhealthy");
    assert_eq!(ev.len(), 3);
    assert_eq!(ev[0].1, "Liveness probe errored and resulted in unknown state: exec failed");
    assert!(!h.metrics.encode().contains("result=\""), "errored probes are not counted");

    // An error then a result: the result counts.
    h.runner.script("c", ProbeType::Liveness, vec![ProbeOutcome::error("once")]);
    h.runner.set("c", ProbeType::Liveness, ProbeOutcome::failure("dead"));
    advance(secs(1.0)).await;
    assert_eq!(h.mgr.liveness().get("containerd://a"), Some(ProbeResult::Failure));
}

/// An exec liveness probe of a binary the image lacks, through the real handlers: the
/// event is upstream's whole message, the runtime's gRPC status in Go's words included.
#[tokio::test(start_paused = true)]
async fn a_failed_exec_is_reported_in_upstreams_words() {
    const DESC: &str = "failed to exec in container: failed to start exec \"e1\": OCI runtime exec failed: \
                        exec failed: unable to start container process: exec: \"/nope\": stat /nope: no such file \
                        or directory: unknown";
    let runtime = Arc::new(crate::container::fake::FakeRuntime::default());
    runtime.set_exec_handler(|_, _, _| {
        Err(crate::container::Error::Rpc { operation: "exec_sync", status: tonic::Status::unknown(DESC) })
    });
    let h = Harness::immediate();
    let events = Arc::new(FakeRecorder::default());
    let mgr = ProbeManager::with_jitter(
        Arc::new(runner::HandlerRunner::new(runtime.clone())),
        events.clone(),
        Arc::new(ProberMetrics::new()),
        || 0.0,
    );
    let p = pod("u", vec![with_probes(container("c"), None, None, Some(thresholds(probe(1), 1, 3)))], vec![]);
    mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    mgr.add_pod(&p);
    advance(secs(0.5)).await;
    assert_eq!(runtime.exec_calls().len(), 3, "three attempts");
    let message =
        format!("Liveness probe errored and resulted in unknown state: rpc error: code = Unknown desc = {DESC}");
    assert_eq!(
        events.with_reason("Unhealthy"),
        vec![(EventType::Warning, message, Some("spec.containers{c}".to_owned()))]
    );
}

#[tokio::test(start_paused = true)]
async fn warning_counts_as_success_and_unknown_as_failure() {
    let h = Harness::immediate();
    let p = pod(
        "u",
        vec![
            with_probes(container("w"), None, Some(thresholds(probe(1), 1, 1)), None),
            with_probes(container("k"), None, Some(thresholds(probe(1), 1, 1)), None),
        ],
        vec![],
    );
    h.runner.set("w", ProbeType::Readiness, ProbeOutcome::warning("careful"));
    h.runner.set("k", ProbeType::Readiness, ProbeOutcome::unknown("who knows"));
    h.mgr.set_pod_status(
        "u",
        &status(vec![running("w", "w1", h.started(LONG_AGO)), running("k", "k1", h.started(LONG_AGO))], vec![]),
    );
    h.mgr.add_pod(&p);
    settle().await;
    assert_eq!(h.mgr.readiness().get("containerd://w1"), Some(ProbeResult::Success));
    assert_eq!(h.mgr.readiness().get("containerd://k1"), Some(ProbeResult::Failure));
    assert_eq!(
        h.events.with_reason("ProbeWarning"),
        vec![(
            EventType::Warning,
            "Readiness probe warning: careful".to_string(),
            Some("spec.containers{w}".to_string())
        )]
    );
    assert_eq!(h.events.with_reason("Unhealthy")[0].1, "Readiness probe failed: who knows");
}

// ---------------------------------------------------------------- startup

#[tokio::test(start_paused = true)]
async fn startup_gates_liveness_and_readiness() {
    let mut h = Harness::immediate();
    let c = with_probes(
        container("c"),
        Some(thresholds(probe(1), 1, 5)),
        Some(thresholds(probe(1), 1, 3)),
        Some(thresholds(probe(1), 1, 3)),
    );
    let p = pod("u", vec![c], vec![]);
    h.runner.script(
        "c",
        ProbeType::Startup,
        vec![ProbeOutcome::failure("not yet"), ProbeOutcome::failure("not yet"), ProbeOutcome::success("")],
    );
    let st = status(vec![running("c", "a", h.started(LONG_AGO))], vec![]);
    h.mgr.set_pod_status("u", &st);
    h.mgr.add_pod(&p);
    let started_ready = |h: &Harness| {
        let mut s = st.clone();
        h.mgr.update_pod_status(&p, &mut s);
        let cs = &s.container_statuses.unwrap()[0];
        (cs.started, cs.ready)
    };

    advance(secs(1.5)).await;
    assert_eq!(h.mgr.startup().get("containerd://a"), Some(ProbeResult::Unknown));
    assert_eq!(started_ready(&h), (Some(false), false));
    advance(secs(1.0)).await; // startup succeeds at 2 s
    assert_eq!(h.mgr.startup().get("containerd://a"), Some(ProbeResult::Success));
    assert_eq!(ms(&h.runner.times("c", ProbeType::Startup)), vec![0, 1000, 2000]);
    for t in [ProbeType::Liveness, ProbeType::Readiness] {
        assert!(h.runner.times("c", t).iter().all(|at| *at >= secs(2.0)), "{t} probed before the container started");
    }
    advance(secs(3.0)).await;
    for t in [ProbeType::Liveness, ProbeType::Readiness] {
        assert!(h.runner.times("c", t).len() >= 3, "{t} runs once started");
    }
    assert_eq!(h.runner.times("c", ProbeType::Startup).len(), 3, "startup stops once it succeeded");
    assert_eq!(started_ready(&h), (Some(true), true));
    let results = h.drain_results();
    assert!(results.contains(&(ProbeType::Startup, ProbeResult::Unknown)));
    assert!(results.contains(&(ProbeType::Startup, ProbeResult::Success)));
    assert!(results.contains(&(ProbeType::Readiness, ProbeResult::Success)));
}

#[tokio::test(start_paused = true)]
async fn startup_failure_holds_and_keeps_liveness_off() {
    let mut h = Harness::immediate();
    let mut sp = thresholds(probe(1), 1, 2);
    sp.termination_grace_period_seconds = Some(3);
    let c = with_probes(container("c"), Some(sp), None, Some(probe(1)));
    let p = with_restart_policy(pod("u", vec![c], vec![]), "Never");
    h.runner.set("c", ProbeType::Startup, ProbeOutcome::failure("slow"));
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(1.5)).await;
    assert_eq!(h.mgr.startup().get("containerd://a"), Some(ProbeResult::Failure));
    let u = h.drain();
    assert_eq!(u.last().map(|u| (u.result, u.termination_grace_period_seconds)), Some((ProbeResult::Failure, Some(3))));
    advance(secs(5.0)).await;
    assert_eq!(h.runner.times("c", ProbeType::Startup).len(), 2, "on hold after the verdict");
    assert!(h.runner.times("c", ProbeType::Liveness).is_empty());
    let kill = h.mgr.container_to_kill(&p, "c", "containerd://a").unwrap();
    assert_eq!(kill.message, "Container c failed startup probe");
    assert!(!kill.restart);
    assert_eq!(kill.grace_period_seconds, 3);
}

// ---------------------------------------------------------------- container states

#[tokio::test(start_paused = true)]
async fn non_running_containers_are_not_probed_nor_ready() {
    let mut h = Harness::immediate();
    let c = with_probes(container("c"), None, Some(probe(1)), Some(probe(1)));
    let p = pod("u", vec![c], vec![]);
    // No container id yet: wait.
    h.mgr.set_pod_status("u", &status(vec![waiting("c", None)], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(2.5)).await;
    assert!(h.drain().is_empty());
    // Created but not running.
    h.mgr.set_pod_status("u", &status(vec![waiting("c", Some("a"))], vec![]));
    advance(secs(2.0)).await;
    assert_eq!(h.runner.count(), 0);
    assert_eq!(h.mgr.readiness().get("containerd://a"), Some(ProbeResult::Failure));
    assert_eq!(h.mgr.liveness().get("containerd://a"), Some(ProbeResult::Failure));
    let mut s = status(vec![waiting("c", Some("a"))], vec![]);
    h.mgr.update_pod_status(&p, &mut s);
    let cs = &s.container_statuses.unwrap()[0];
    assert_eq!((cs.started, cs.ready), (Some(false), false));
    assert_eq!(h.mgr.worker_count(), 2, "will run later");

    // Exited, restartPolicy Always: still waiting for the restart.
    h.mgr.set_pod_status("u", &status(vec![terminated("c", "a", 1)], vec![]));
    advance(secs(2.0)).await;
    assert_eq!(h.mgr.worker_count(), 2);
    assert_eq!(h.runner.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn workers_end_when_the_container_will_not_restart() {
    let h = Harness::immediate();
    let regular = with_probes(container("c"), None, Some(probe(1)), Some(probe(1)));
    let side = sidecar(with_probes(container("s"), None, Some(probe(1)), None));
    let p = with_restart_policy(pod("u", vec![regular], vec![side]), "Never");
    h.mgr.set_pod_status(
        "u",
        &status(vec![running("c", "a", h.started(LONG_AGO))], vec![running("s", "sa", h.started(LONG_AGO))]),
    );
    h.mgr.add_pod(&p);
    advance(secs(1.5)).await;
    assert_eq!(h.mgr.worker_count(), 3);
    assert_eq!(h.mgr.readiness().get("containerd://a"), Some(ProbeResult::Success));

    h.mgr.set_pod_status("u", &status(vec![terminated("c", "a", 0)], vec![terminated("s", "sa", 1)]));
    advance(secs(1.0)).await;
    assert!(!h.mgr.has_worker("u", "c", ProbeType::Readiness));
    assert!(!h.mgr.has_worker("u", "c", ProbeType::Liveness));
    assert!(h.mgr.has_worker("u", "s", ProbeType::Readiness), "sidecars are always restarted");
    assert_eq!(h.mgr.readiness().get("containerd://a"), None, "an ending worker drops its results");
    assert_eq!(h.mgr.readiness().get("containerd://sa"), Some(ProbeResult::Failure));
}

#[tokio::test(start_paused = true)]
async fn terminal_phase_ends_every_worker() {
    let h = Harness::immediate();
    let p = pod("u", vec![with_probes(container("c"), Some(probe(1)), Some(probe(1)), Some(probe(1)))], vec![]);
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(1.5)).await;
    assert_eq!(h.mgr.worker_count(), 3);
    let mut st = status(vec![terminated("c", "a", 0)], vec![]);
    st.phase = Some("Succeeded".into());
    h.mgr.set_pod_status("u", &st);
    advance(secs(1.0)).await;
    assert_eq!(h.mgr.worker_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn deletion_quiets_liveness_and_startup_but_not_readiness() {
    let mut h = Harness::immediate();
    h.runner.set("c", ProbeType::Liveness, ProbeOutcome::failure("dying"));
    let mut p = pod(
        "u",
        vec![
            with_probes(container("c"), None, Some(probe(1)), Some(thresholds(probe(1), 1, 1))),
            with_probes(container("d"), Some(probe(1)), None, None),
        ],
        vec![],
    );
    p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    h.mgr.set_pod_status(
        "u",
        &status(vec![running("c", "a", h.started(LONG_AGO)), running("d", "b", h.started(LONG_AGO))], vec![]),
    );
    h.mgr.add_pod(&p);
    advance(secs(3.5)).await;
    assert_eq!(h.mgr.worker_count(), 1);
    assert!(h.mgr.has_worker("u", "c", ProbeType::Readiness));
    assert!(h.runner.times("c", ProbeType::Liveness).is_empty());
    assert!(h.runner.times("d", ProbeType::Startup).is_empty());
    assert_eq!(h.runner.times("c", ProbeType::Readiness).len(), 4);
    // The results went to Success, then were dropped as the workers ended.
    let results: HashSet<_> = h.drain_results().into_iter().collect();
    assert!(results.contains(&(ProbeType::Startup, ProbeResult::Success)));
    assert!(!results.contains(&(ProbeType::Liveness, ProbeResult::Failure)));
}

// ---------------------------------------------------------------- manager

#[tokio::test(start_paused = true)]
async fn add_pod_is_idempotent_and_covers_sidecars_only() {
    let h = Harness::immediate();
    let p = pod(
        "u",
        vec![with_probes(container("c"), Some(probe(5)), Some(probe(5)), Some(probe(5)))],
        vec![
            sidecar(with_probes(container("s"), Some(probe(5)), None, Some(probe(5)))),
            // Regular init containers cannot have probes; if they do, they are ignored.
            with_probes(container("i"), None, Some(probe(5)), None),
        ],
    );
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    h.mgr.add_pod(&p);
    assert_eq!(h.mgr.worker_count(), 5);
    assert!(!h.mgr.has_worker("u", "i", ProbeType::Readiness));
    advance(secs(6.0)).await;
    h.mgr.add_pod(&p);
    advance(secs(0.5)).await;
    assert_eq!(ms(&h.runner.times("c", ProbeType::Startup)), vec![0], "no second worker, startup on hold");
    // The startup worker ran first and succeeded at once, so readiness ran at 0 too.
    assert_eq!(ms(&h.runner.times("c", ProbeType::Readiness)), vec![0, 5000], "no second worker");
}

#[tokio::test(start_paused = true)]
async fn remove_pod_stops_workers_results_and_series() {
    let h = Harness::immediate();
    let p = pod("u", vec![with_probes(container("c"), None, Some(probe(1)), Some(probe(1)))], vec![]);
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(2.5)).await;
    assert_eq!(h.mgr.liveness().len() + h.mgr.readiness().len(), 2);
    assert!(h.metrics.encode().contains("pod_uid=\"u\""));
    let calls = h.runner.count();

    h.mgr.remove_pod("u");
    settle().await;
    assert_eq!(h.mgr.worker_count(), 0);
    assert!(h.mgr.liveness().is_empty() && h.mgr.readiness().is_empty());
    advance(secs(5.0)).await;
    assert_eq!(h.runner.count(), calls);
    let text = h.metrics.encode();
    assert!(!text.contains("pod=\"pod-u\""), "series removed:\n{text}");

    // Added again (same uid, e.g. after a restart of the agent's view): works again.
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    settle().await;
    assert_eq!(h.mgr.worker_count(), 2);
    assert!(h.runner.count() > calls);
}

#[tokio::test(start_paused = true)]
async fn cleanup_pods_and_stop_liveness_and_startup() {
    let h = Harness::immediate();
    let mk = |uid: &str| {
        pod(
            uid,
            vec![with_probes(container("c"), Some(probe(1)), Some(probe(1)), Some(probe(1)))],
            vec![sidecar(with_probes(container("s"), None, None, Some(probe(1))))],
        )
    };
    let (p1, p2) = (mk("one"), mk("two"));
    for uid in ["one", "two"] {
        h.mgr.set_pod_status(uid, &status(vec![running("c", uid, h.started(LONG_AGO))], vec![]));
    }
    h.mgr.add_pod(&p1);
    h.mgr.add_pod(&p2);
    assert_eq!(h.mgr.worker_count(), 8);

    h.mgr.cleanup_pods(&HashSet::from(["one".to_string()]));
    settle().await;
    assert_eq!(h.mgr.worker_count(), 4);
    assert!(!h.mgr.has_worker("two", "c", ProbeType::Readiness));

    h.mgr.stop_liveness_and_startup(&p1);
    settle().await;
    assert!(h.mgr.has_worker("one", "c", ProbeType::Readiness));
    assert!(!h.mgr.has_worker("one", "c", ProbeType::Liveness));
    assert!(!h.mgr.has_worker("one", "c", ProbeType::Startup));
    assert!(h.mgr.has_worker("one", "s", ProbeType::Liveness), "sidecars keep liveness while terminating");

    h.mgr.shutdown();
    settle().await;
    assert_eq!(h.mgr.worker_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn initial_results_per_probe_type() {
    let mut h = Harness::immediate();
    let mut sp = probe(1);
    sp.initial_delay_seconds = Some(100);
    let mut rp = probe(1);
    rp.initial_delay_seconds = Some(100);
    let mut lp = probe(1);
    lp.initial_delay_seconds = Some(100);
    let p = pod("u", vec![with_probes(container("c"), Some(sp), Some(rp), Some(lp))], vec![]);
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(Duration::ZERO))], vec![]));
    h.mgr.add_pod(&p);
    settle().await;
    assert_eq!(h.mgr.result(ProbeType::Readiness, "containerd://a"), Some(ProbeResult::Failure));
    assert_eq!(h.mgr.result(ProbeType::Liveness, "containerd://a"), Some(ProbeResult::Success));
    assert_eq!(h.mgr.result(ProbeType::Startup, "containerd://a"), Some(ProbeResult::Unknown));
    assert_eq!(h.drain().len(), 3, "initial values are updates too");
    assert!(h.mgr.take_updates().is_none(), "the stream is taken once");
}

// ---------------------------------------------------------------- UpdatePodStatus

#[tokio::test(start_paused = true)]
async fn update_pod_status_without_probes() {
    let h = Harness::immediate();
    let p = pod(
        "u",
        vec![container("run"), container("wait")],
        vec![container("init-ok"), container("init-bad"), sidecar(container("side"))],
    );
    h.mgr.add_pod(&p);
    let mut s = status(
        vec![running("run", "r", h.started(LONG_AGO)), waiting("wait", None)],
        vec![
            terminated("init-ok", "i1", 0),
            terminated("init-bad", "i2", 1),
            running("side", "s1", h.started(LONG_AGO)),
        ],
    );
    // Whatever the status generator put there is overwritten.
    for cs in s.container_statuses.iter_mut().flatten() {
        cs.ready = true;
    }
    h.mgr.update_pod_status(&p, &mut s);
    let got: Vec<_> = s
        .container_statuses
        .iter()
        .chain(s.init_container_statuses.iter())
        .flatten()
        .map(|c| (c.name.as_str(), c.started, c.ready))
        .collect();
    assert_eq!(
        got,
        vec![
            ("run", Some(true), true),
            ("wait", Some(false), false),
            ("init-ok", Some(false), true),
            ("init-bad", Some(false), false),
            ("side", Some(true), true),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn update_pod_status_with_probes_and_manual_readiness_run() {
    let h = Harness::immediate();
    let p = pod(
        "u",
        vec![
            with_probes(container("r"), None, Some(probe(100)), None),
            with_probes(container("st"), Some(probe(100)), None, None),
        ],
        vec![sidecar(with_probes(container("side"), None, Some(probe(100)), None))],
    );
    h.runner.set("r", ProbeType::Readiness, ProbeOutcome::failure("warming up"));
    h.runner.set("side", ProbeType::Readiness, ProbeOutcome::failure("warming up"));
    h.runner.set("st", ProbeType::Startup, ProbeOutcome::failure("slow"));
    let st = status(
        vec![running("r", "r1", h.started(LONG_AGO)), running("st", "st1", h.started(LONG_AGO))],
        vec![running("side", "s1", h.started(LONG_AGO))],
    );
    let view = |h: &Harness| {
        let mut s = st.clone();
        h.mgr.update_pod_status(&p, &mut s);
        s.container_statuses
            .iter()
            .chain(s.init_container_statuses.iter())
            .flatten()
            .map(|c| (c.name.clone(), c.started, c.ready))
            .collect::<Vec<_>>()
    };

    // Before any worker has seen the containers: a startup probe that has not run means
    // "not started"; readiness not yet succeeded means "not ready".
    h.mgr.add_pod(&p);
    assert_eq!(
        view(&h),
        vec![("r".into(), Some(true), false), ("st".into(), Some(false), false), ("side".into(), Some(true), false)]
    );
    h.mgr.set_pod_status("u", &st);
    advance(secs(1.0)).await;
    assert_eq!(h.runner.times("r", ProbeType::Readiness).len(), 2, "the first view asked for a run");

    // Probes now succeed; a status update asks for an immediate readiness run instead
    // of waiting 100 s.
    h.runner.set("r", ProbeType::Readiness, ProbeOutcome::success(""));
    h.runner.set("side", ProbeType::Readiness, ProbeOutcome::success(""));
    let _ = view(&h);
    settle().await;
    assert_eq!(
        view(&h),
        vec![("r".into(), Some(true), true), ("st".into(), Some(false), false), ("side".into(), Some(true), true)]
    );
    assert!(h.runner.times("r", ProbeType::Readiness).iter().all(|at| *at < secs(2.0)));
    assert_eq!(h.runner.times("st", ProbeType::Startup).len(), 1, "startup is not triggered");

    // The next periodic readiness probe comes one period after the manual one.
    advance(secs(99.5)).await;
    let n = h.runner.times("r", ProbeType::Readiness).len();
    advance(secs(1.0)).await;
    assert_eq!(h.runner.times("r", ProbeType::Readiness).len(), n + 1);
}

// ---------------------------------------------------------------- kill decisions

#[test]
fn kill_grace_period_follows_upstream_precedence() {
    let mut lp = probe(1);
    lp.termination_grace_period_seconds = Some(7);
    let c = with_probes(container("c"), Some(probe(1)), None, Some(lp));
    let mut p = pod("u", vec![c.clone()], vec![]);
    assert_eq!(probe_kill_grace_period(&p, &c, ProbeType::Liveness), 7);
    assert_eq!(probe_kill_grace_period(&p, &c, ProbeType::Startup), 30, "no probe-level value: the pod's");
    p.metadata.deletion_grace_period_seconds = Some(1);
    assert_eq!(probe_kill_grace_period(&p, &c, ProbeType::Liveness), 1, "deletion grace wins");
    p.metadata.deletion_grace_period_seconds = None;
    p.spec.as_mut().unwrap().termination_grace_period_seconds = None;
    assert_eq!(probe_kill_grace_period(&p, &c, ProbeType::Liveness), 2, "upstream minimum without a pod value");
}

#[tokio::test(start_paused = true)]
async fn sidecar_kill_messages() {
    let h = Harness::immediate();
    let side =
        sidecar(with_probes(container("s"), Some(thresholds(probe(1), 1, 1)), None, Some(thresholds(probe(1), 1, 1))));
    let p = with_restart_policy(pod("u", vec![container("c")], vec![side]), "Never");
    h.runner.set("s", ProbeType::Startup, ProbeOutcome::failure("x"));
    h.mgr.set_pod_status("u", &status(vec![waiting("c", None)], vec![running("s", "s1", h.started(LONG_AGO))]));
    h.mgr.add_pod(&p);
    settle().await;
    let kill = h.mgr.container_to_kill(&p, "s", "containerd://s1").unwrap();
    assert_eq!(kill.message, "Init container s failed startup probe");
    assert!(kill.restart);
    assert_eq!(
        h.events.with_reason("Unhealthy")[0].2.as_deref(),
        Some("spec.initContainers{s}"),
        "events point at the init container"
    );
    assert!(h.mgr.container_to_kill(&p, "c", "containerd://c1").is_none());
}

// ---------------------------------------------------------------- metrics

/// The value of the sample `name{labels}` in a text exposition.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            return None;
        }
        let body = rest.strip_suffix('}')?;
        let got: HashMap<&str, &str> = body
            .split("\",")
            .filter(|kv| !kv.is_empty())
            .filter_map(|kv| {
                let (k, v) = kv.split_once("=\"")?;
                Some((k, v.trim_end_matches('"')))
            })
            .collect();
        let want: HashMap<&str, &str> = labels.iter().copied().collect();
        (got == want).then(|| value.parse().ok())?
    })
}

#[tokio::test(start_paused = true)]
async fn metrics_families_counts_and_labels() {
    let h = Harness::immediate();
    let p = pod("u", vec![with_probes(container("c"), None, Some(thresholds(probe(1), 1, 5)), Some(probe(1)))], vec![]);
    h.runner.script(
        "c",
        ProbeType::Readiness,
        vec![ProbeOutcome::failure(""), ProbeOutcome::success(""), ProbeOutcome::failure("")],
    );
    h.runner.set("c", ProbeType::Readiness, ProbeOutcome::warning("w"));
    h.mgr.set_pod_status("u", &status(vec![running("c", "a", h.started(LONG_AGO))], vec![]));
    h.mgr.add_pod(&p);
    advance(secs(3.5)).await; // 4 rounds: readiness F S F W(=success), liveness S S S S

    let text = h.metrics.encode();
    let total = |probe_type: &str, result: &str| {
        sample(
            &text,
            "prober_probe_total",
            &[
                ("container", "c"),
                ("namespace", "ns"),
                ("pod", "pod-u"),
                ("pod_uid", "u"),
                ("probe_type", probe_type),
                ("result", result),
            ],
        )
    };
    assert_eq!(total("Readiness", "successful"), Some(2.0));
    assert_eq!(total("Readiness", "failed"), Some(2.0));
    assert_eq!(total("Liveness", "successful"), Some(4.0));
    assert_eq!(total("Liveness", "failed"), None);
    let dur = |probe_type: &str| {
        sample(
            &text,
            "prober_probe_duration_seconds_count",
            &[("container", "c"), ("namespace", "ns"), ("pod", "pod-u"), ("probe_type", probe_type)],
        )
    };
    assert_eq!(dur("Readiness"), Some(2.0), "successful probes only");
    assert_eq!(dur("Liveness"), Some(4.0));
    let buckets = text.lines().filter(|l| l.starts_with("prober_probe_duration_seconds_bucket{")).count();
    assert_eq!(buckets, 2 * 12, "11 default buckets and +Inf per series");
    assert!(text.contains("prober_probe_duration_seconds_bucket{container=\"c\",namespace=\"ns\",pod=\"pod-u\",probe_type=\"Liveness\",le=\"0.005\"} 4"));

    for (family, kind, help) in [
        (
            "prober_probe_total",
            "counter",
            "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
        ),
        ("prober_probe_duration_seconds", "histogram", "[ALPHA] Duration in seconds for a probe response."),
        ("process_start_time_seconds", "gauge", "[ALPHA] Start time of the process since unix epoch in seconds."),
    ] {
        assert!(text.contains(&format!("# HELP {family} {help}\n")), "{family} help in:\n{text}");
        assert!(text.contains(&format!("# TYPE {family} {kind}\n")), "{family} type in:\n{text}");
    }
    let start = sample(&text, "process_start_time_seconds", &[]).unwrap();
    assert!(start > 1.6e9, "a plausible epoch time: {start}");
    assert!(!text.contains("# EOF"), "Prometheus text, not OpenMetrics");

    h.mgr.stop_liveness_and_startup(&p);
    settle().await;
    let text = h.metrics.encode();
    assert_eq!(sample(&text, "prober_probe_total", &[]), None);
    assert!(!text.contains("probe_type=\"Liveness\""), "a stopped worker's series go:\n{text}");
    assert!(text.contains("probe_type=\"Readiness\""));
}
