use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::{GoDuration, KubeletConfiguration, ShutdownGracePeriodByPodPriority};

fn pod(name: &str, priority: Option<i32>, grace: Option<i64>) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": [], "priority": priority, "terminationGracePeriodSeconds": grace},
    }))
    .unwrap()
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
}

fn pp(priority: i32, grace_seconds: i64) -> PriorityPeriod {
    PriorityPeriod { priority, grace_seconds }
}

#[test]
fn no_grace_period_turns_the_feature_off() {
    let kc = KubeletConfiguration::default();
    assert!(periods(&crate::settings::node_shutdown(&kc)).is_empty());
}

#[test]
fn the_two_periods_become_a_regular_and_a_critical_group() {
    let kc = KubeletConfiguration {
        shutdown_grace_period: GoDuration::from_secs(30),
        shutdown_grace_period_critical_pods: GoDuration::from_secs(10),
        ..KubeletConfiguration::default()
    };
    assert_eq!(periods(&crate::settings::node_shutdown(&kc)), vec![pp(0, 20), pp(SYSTEM_CRITICAL_PRIORITY, 10)]);
    assert_eq!(period_requested(&periods(&crate::settings::node_shutdown(&kc))), Duration::from_secs(30));
    // The critical part alone (no time for regular pods) is still two groups.
    assert_eq!(migrate(Duration::from_secs(5), Duration::from_secs(5)), vec![pp(0, 0), pp(2_000_000_000, 5)]);
    assert!(migrate(Duration::from_secs(5), Duration::from_secs(6)).is_empty());
}

#[test]
fn periods_by_priority_are_sorted_and_need_their_gate() {
    let mut kc = KubeletConfiguration {
        shutdown_grace_period_by_pod_priority: vec![
            ShutdownGracePeriodByPodPriority { priority: 100_000, shutdown_grace_period_seconds: 10 },
            ShutdownGracePeriodByPodPriority { priority: 0, shutdown_grace_period_seconds: 60 },
            ShutdownGracePeriodByPodPriority { priority: 2_000_000_000, shutdown_grace_period_seconds: 5 },
        ],
        ..KubeletConfiguration::default()
    };
    assert_eq!(periods(&crate::settings::node_shutdown(&kc)), vec![pp(0, 60), pp(100_000, 10), pp(2_000_000_000, 5)]);
    kc.feature_gates.insert("GracefulNodeShutdownBasedOnPodPriority".into(), false);
    assert!(
        periods(&crate::settings::node_shutdown(&kc)).is_empty(),
        "without the gate the list is ignored (and shutdownGracePeriod is 0)"
    );
    kc.feature_gates.insert("GracefulNodeShutdownBasedOnPodPriority".into(), true);
    kc.feature_gates.insert("GracefulNodeShutdown".into(), false);
    assert!(periods(&crate::settings::node_shutdown(&kc)).is_empty());
}

#[test]
fn pods_go_to_the_highest_group_at_or_below_their_priority() {
    let periods = [pp(1, 10), pp(2, 20), pp(3, 30), pp(4, 40)];
    let pods = vec![
        pod("none", None, None),
        pod("below", Some(0), None),
        pod("one", Some(1), None),
        pod("two", Some(2), None),
        pod("between", Some(3), None),
        pod("top", Some(4), None),
        pod("above", Some(5), None),
    ];
    let groups = group_by_priority(&periods, pods);
    let got: Vec<Vec<String>> = groups.iter().map(|g| names(&g.pods)).collect();
    assert_eq!(got, vec![vec!["none", "below", "one"], vec!["two"], vec!["between"], vec!["top", "above"]]);
    // Between two groups: the lower one.
    let groups = group_by_priority(&[pp(0, 5), pp(2_000_000_000, 5)], vec![pod("p", Some(1_000_000), None)]);
    assert_eq!(names(&groups[0].pods), ["p"]);
    assert!(group_by_priority(&[], vec![pod("p", None, None)]).is_empty());
}

#[test]
fn a_pod_keeps_its_own_grace_period_when_shorter() {
    assert_eq!(effective_grace(&pod("p", None, Some(3)), 10), 3);
    assert_eq!(effective_grace(&pod("p", None, Some(10)), 10), 10);
    assert_eq!(effective_grace(&pod("p", None, Some(30)), 10), 10);
    assert_eq!(effective_grace(&pod("p", None, None), 10), 10);
}

#[test]
fn terminated_pods_get_upstreams_status() {
    let now = Time(jiff::Timestamp::from_second(1_700_000_000).unwrap());
    let mut status = PodStatus { phase: Some("Running".into()), ..PodStatus::default() };
    apply_shutdown_status(&mut status, now.clone());
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("Terminated"));
    assert_eq!(status.message.as_deref(), Some("Pod was terminated in response to imminent node shutdown."));
    let c = &status.conditions.as_ref().unwrap()[0];
    assert_eq!((c.type_.as_str(), c.status.as_str()), ("DisruptionTarget", "True"));
    assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
    assert_eq!(c.message.as_deref(), Some(MESSAGE));
    assert_eq!(c.last_transition_time.as_ref(), Some(&now));
    // A pod that already succeeded stays Succeeded; the condition is not duplicated.
    let mut done = PodStatus { phase: Some("Succeeded".into()), ..status.clone() };
    apply_shutdown_status(&mut done, Time(jiff::Timestamp::now()));
    assert_eq!(done.phase.as_deref(), Some("Succeeded"));
    assert_eq!(done.conditions.as_ref().unwrap().len(), 1);
    assert_eq!(done.conditions.as_ref().unwrap()[0].last_transition_time.as_ref(), Some(&now));
}

#[test]
fn admission_and_readiness_follow_the_shutdown_status() {
    let status = ShutdownStatus::default();
    let p = pod("late", None, None);
    assert!(status.admit(&p, &[]).is_ok());
    status.set(true);
    let rejection = status.admit(&p, &[]).unwrap_err();
    assert_eq!(rejection.reason, "NodeShutdown");
    assert_eq!(rejection.message, "Pod was rejected as the node is shutting down.");
    assert_eq!(status.check(), Err("node is shutting down".into()));
}

#[test]
fn the_logind_drop_in_sets_inhibit_delay_max_sec() {
    assert_eq!(
        systemd::logind_drop_in(Duration::from_secs(45)),
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=45\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("logind.conf.d");
    systemd::override_inhibit_delay(&conf, Duration::from_secs(90)).unwrap();
    let text = std::fs::read_to_string(conf.join("99-kubelet.conf")).unwrap();
    assert!(text.ends_with("InhibitDelayMaxSec=90\n"), "{text}");
}

#[test]
fn the_state_file_round_trips_in_gos_format() {
    let dir = tempfile::tempdir().unwrap();
    let storage = storage::Storage::new(dir.path().join(STATE_FILE));
    assert_eq!(storage.load().unwrap(), storage::State::default(), "no file yet");
    let start: jiff::Timestamp = "2026-12-01T05:00:00.5Z".parse().unwrap();
    storage.store(&storage::State { start_time: Some(start), end_time: None }).unwrap();
    let text = std::fs::read_to_string(storage.path()).unwrap();
    assert_eq!(text, r#"{"startTime":"2026-12-01T05:00:00.5Z","endTime":"0001-01-01T00:00:00Z"}"#);
    assert_eq!(storage.load().unwrap(), storage::State { start_time: Some(start), end_time: None });
    let end: jiff::Timestamp = "2026-12-01T05:00:30Z".parse().unwrap();
    storage.store(&storage::State { start_time: Some(start), end_time: Some(end) }).unwrap();
    assert_eq!(storage.load().unwrap().end_time, Some(end));
    assert!((storage::timestamp(Some(start)) - 1_796_101_200.0).abs() < f64::EPSILON);
    assert!(storage::timestamp(None).abs() < f64::EPSILON);
    // Go writes local offsets; they parse too. No temp files are left behind.
    std::fs::write(storage.path(), r#"{"startTime":"2026-12-01T06:00:00.5+01:00","endTime":"0001-01-01T00:00:00Z"}"#)
        .unwrap();
    assert_eq!(storage.load().unwrap().start_time, Some(start));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    std::fs::write(storage.path(), "{").unwrap();
    assert!(storage.load().unwrap_err().to_string().contains(STATE_FILE));
}

/// Records each kill: which pod, its grace period, when it started; a pod takes as long
/// as its `terminationGracePeriodSeconds` says (in paused time), capped by its grace.
#[derive(Default)]
struct FakeTerminator {
    kills: Mutex<Vec<(String, i64, Instant, bool)>>,
    status: Mutex<Option<ShutdownStatus>>,
    takes: Mutex<std::collections::HashMap<String, Duration>>,
}

#[async_trait]
impl PodTerminator for FakeTerminator {
    async fn terminate(&self, pod: &Pod, grace: i64) -> Result<(), BoxError> {
        let name = pod.metadata.name.clone().unwrap();
        let shutting_down = self.status.lock().unwrap().as_ref().is_some_and(|s| s.check().is_err());
        self.kills.lock().unwrap().push((name.clone(), grace, Instant::now(), shutting_down));
        let takes = self.takes.lock().unwrap().get(&name).copied().unwrap_or_default();
        tokio::time::sleep(takes).await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn groups_are_killed_in_order_each_in_parallel_within_its_period() {
    let fake = Arc::new(FakeTerminator::default());
    fake.takes.lock().unwrap().extend([
        ("regular-a".to_owned(), Duration::from_secs(2)),
        ("regular-b".to_owned(), Duration::from_secs(3)),
        // Never stops within its group's period: the next group starts when it is over.
        ("mid".to_owned(), Duration::from_mins(1)),
        ("critical".to_owned(), Duration::from_secs(1)),
    ]);
    let terminator: Arc<dyn PodTerminator> = fake.clone();
    let t0 = Instant::now();
    let pods = vec![
        pod("critical", Some(SYSTEM_CRITICAL_PRIORITY), None),
        pod("mid", Some(1000), Some(60)),
        pod("regular-a", None, Some(1)),
        pod("regular-b", Some(0), None),
    ];
    kill_pods(&[pp(0, 10), pp(1000, 5), pp(SYSTEM_CRITICAL_PRIORITY, 7)], pods, &terminator).await;
    let kills: Vec<(String, i64, Duration)> =
        fake.kills.lock().unwrap().iter().map(|(n, g, at, _)| (n.clone(), *g, *at - t0)).collect();
    assert_eq!(
        kills,
        vec![
            // Both regular pods at once; one keeps its own shorter grace period.
            ("regular-a".into(), 1, Duration::ZERO),
            ("regular-b".into(), 10, Duration::ZERO),
            // Once both stopped (3 s), not after the group's 10 s.
            ("mid".into(), 5, Duration::from_secs(3)),
            // After mid's group's 5 s ran out.
            ("critical".into(), 7, Duration::from_secs(8)),
        ]
    );
    // The wait ends with the last group's pods.
    assert_eq!(t0.elapsed(), Duration::from_secs(9));
}

/// logind and systemd as the manager sees them.
struct FakeBus {
    delay: Mutex<Duration>,
    /// What a reload makes the delay (None: unchanged).
    after_reload: Option<Duration>,
    reloads: Mutex<u32>,
    locks: Mutex<u32>,
    /// Locks taken while nobody was subscribed to `PrepareForShutdown`.
    locks_unwatched: Mutex<u32>,
    events: Mutex<Option<mpsc::Receiver<bool>>>,
}

impl FakeBus {
    fn new(delay: Duration, after_reload: Option<Duration>) -> (Self, mpsc::Sender<bool>) {
        let (tx, rx) = mpsc::channel(8);
        let bus = Self {
            delay: Mutex::new(delay),
            after_reload,
            reloads: Mutex::new(0),
            locks: Mutex::new(0),
            locks_unwatched: Mutex::new(0),
            events: Mutex::new(Some(rx)),
        };
        (bus, tx)
    }
}

#[async_trait]
impl Inhibiter for FakeBus {
    async fn current_inhibit_delay(&self) -> Result<Duration> {
        Ok(*self.delay.lock().unwrap())
    }

    async fn inhibit_shutdown(&self) -> Result<InhibitLock> {
        *self.locks.lock().unwrap() += 1;
        if self.events.lock().unwrap().is_some() {
            *self.locks_unwatched.lock().unwrap() += 1;
        }
        let (_, writer) = std::io::pipe().unwrap();
        Ok(InhibitLock::new(writer.into()))
    }

    async fn reload_logind_conf(&self) -> Result<()> {
        *self.reloads.lock().unwrap() += 1;
        if let Some(d) = self.after_reload {
            *self.delay.lock().unwrap() = d;
        }
        Ok(())
    }

    async fn monitor_shutdown(&self) -> Result<mpsc::Receiver<bool>> {
        Ok(self.events.lock().unwrap().take().expect("monitored once"))
    }
}

fn manager(dir: &std::path::Path, pods: Vec<Pod>, fake: &Arc<FakeTerminator>) -> Manager {
    let m = Manager::new(
        vec![pp(0, 20), pp(SYSTEM_CRITICAL_PRIORITY, 10)],
        dir,
        Arc::new(move || pods.clone()),
        fake.clone() as Arc<dyn PodTerminator>,
    )
    .with_logind_conf_dir(dir.join("logind.conf.d"));
    *fake.status.lock().unwrap() = Some(m.status());
    m
}

#[tokio::test(start_paused = true)]
async fn a_short_logind_delay_is_raised_through_the_drop_in_and_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeTerminator::default());
    let m = manager(dir.path(), vec![], &fake);
    let (bus, _events) = FakeBus::new(Duration::from_secs(5), Some(Duration::from_secs(30)));
    let (_rx, lock) = m.start_watching(&bus).await.unwrap();
    assert!(lock.is_held());
    assert_eq!((*bus.reloads.lock().unwrap(), *bus.locks.lock().unwrap()), (1, 1));
    let drop_in = std::fs::read_to_string(dir.path().join("logind.conf.d/99-kubelet.conf")).unwrap();
    assert!(drop_in.contains("InhibitDelayMaxSec=30\n"), "{drop_in}");

    // Long enough already: nothing written, no reload.
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), vec![], &fake);
    let (bus, _events) = FakeBus::new(Duration::from_secs(30), None);
    m.start_watching(&bus).await.unwrap();
    assert_eq!(*bus.reloads.lock().unwrap(), 0);
    assert!(!dir.path().join("logind.conf.d").exists());
}

/// A shutdown announced the moment the lock exists must reach the manager: the
/// subscription comes first.
#[tokio::test(start_paused = true)]
async fn the_signal_is_subscribed_before_the_lock_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeTerminator::default());
    let m = manager(dir.path(), vec![], &fake);
    let (bus, _events) = FakeBus::new(Duration::from_secs(30), None);
    let (_rx, lock) = m.start_watching(&bus).await.unwrap();
    assert!(lock.is_held());
    assert_eq!((*bus.locks.lock().unwrap(), *bus.locks_unwatched.lock().unwrap()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_delay_logind_keeps_too_short_is_upstreams_error() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeTerminator::default());
    let m = manager(dir.path(), vec![], &fake);
    let (bus, _events) = FakeBus::new(Duration::from_secs(5), None);
    let t0 = Instant::now();
    let err = m.start_watching(&bus).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "node shutdown manager was timed out after 5 attempts waiting for logind InhibitDelayMaxSec to update \
         to 30s (ShutdownGracePeriod), current value is 5s"
    );
    // 100 + 200 + 400 + 800 ms between the five reads.
    assert_eq!(t0.elapsed(), Duration::from_millis(1500));
    assert_eq!(*bus.locks.lock().unwrap(), 0, "no lock without the delay");
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_kills_the_pods_then_releases_the_lock_and_a_cancellation_takes_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeTerminator::default());
    let pods = vec![pod("critical", Some(SYSTEM_CRITICAL_PRIORITY + 1000), None), pod("regular", None, None)];
    let m = manager(dir.path(), pods, &fake);
    let (bus, events) = FakeBus::new(Duration::from_secs(30), None);
    let (rx, mut lock) = m.start_watching(&bus).await.unwrap();
    events.send(true).await.unwrap();
    drop(events);
    m.watch(&bus, rx, &mut lock, &CancellationToken::new()).await;
    let kills: Vec<(String, i64, bool)> =
        fake.kills.lock().unwrap().iter().map(|(n, g, _, s)| (n.clone(), *g, *s)).collect();
    assert_eq!(kills, vec![("regular".into(), 20, true), ("critical".into(), 10, true)]);
    assert!(!lock.is_held(), "released once the pods are done");
    assert_eq!(m.status().check(), Err(SHUTTING_DOWN.to_owned()));
    let state = storage::Storage::new(dir.path().join(STATE_FILE)).load().unwrap();
    assert!(state.start_time.is_some() && state.end_time >= state.start_time, "{state:?}");

    // Cancelled: ready and admitting again, and a new lock.
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeTerminator::default());
    let m = manager(dir.path(), vec![pod("regular", None, None)], &fake);
    let (bus, events) = FakeBus::new(Duration::from_secs(30), None);
    let (rx, mut lock) = m.start_watching(&bus).await.unwrap();
    events.send(true).await.unwrap();
    events.send(false).await.unwrap();
    drop(events);
    m.watch(&bus, rx, &mut lock, &CancellationToken::new()).await;
    assert!(lock.is_held());
    assert_eq!(*bus.locks.lock().unwrap(), 2);
    assert_eq!(m.status().check(), Ok(()));
}

#[test]
fn metrics_come_back_from_the_state_file_unless_the_priority_gate_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let start: jiff::Timestamp = "2026-12-01T05:00:00Z".parse().unwrap();
    let end: jiff::Timestamp = "2026-12-01T05:00:30Z".parse().unwrap();
    storage::Storage::new(dir.path().join(STATE_FILE))
        .store(&storage::State { start_time: Some(start), end_time: Some(end) })
        .unwrap();
    let metrics = Arc::new(ShutdownMetrics::new(&mut prometheus_client::registry::Registry::default()));
    let fake = Arc::new(FakeTerminator::default());
    let mut m = manager(dir.path(), vec![], &fake).with_metrics(metrics.clone());
    m.record = false;
    m.load_metrics();
    assert!(metrics.graceful_shutdown_start_time.get().abs() < f64::EPSILON, "gate off: nothing");
    m.record = true;
    m.load_metrics();
    assert!((metrics.graceful_shutdown_start_time.get() - 1_796_101_200.0).abs() < f64::EPSILON);
    assert!((metrics.graceful_shutdown_end_time.get() - 1_796_101_230.0).abs() < f64::EPSILON);
}
