//! [`GenericPleg`]: the relisting PLEG. Every period (1 s) it lists sandboxes and
//! containers (two CRI calls), diffs each container's state against the previous
//! listing and emits one event per change. It counts as unhealthy when no relist
//! completed within the threshold (3 min), which `/healthz` reports.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{PodLifecycleEvent, PodLifecycleEventGenerator, PodLifecycleEventType};
use crate::container::{ContainerState, RuntimePod, RuntimeService};
use crate::metrics::{ContainerStateLabels, KubeletMetrics};

/// Upstream `genericPlegRelistPeriod`.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// Upstream `genericPlegRelistThreshold`.
pub const RELIST_THRESHOLD: Duration = Duration::from_mins(3);

/// PLEG-level state of a container or sandbox (upstream `plegContainerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

impl From<ContainerState> for PlegState {
    fn from(s: ContainerState) -> Self {
        match s {
            ContainerState::Running => Self::Running,
            ContainerState::Exited => Self::Exited,
            // A created-but-not-started container is "unknown" to the PLEG, as upstream.
            ContainerState::Created | ContainerState::Unknown => Self::Unknown,
        }
    }
}

fn states(pod: &RuntimePod) -> BTreeMap<String, PlegState> {
    let mut m: BTreeMap<String, PlegState> =
        pod.containers.iter().map(|(id, (_, s))| (id.clone(), PlegState::from(*s))).collect();
    for (id, ready) in &pod.sandboxes {
        m.insert(id.clone(), if *ready { PlegState::Running } else { PlegState::Exited });
    }
    m
}

fn events_for(uid: &str, id: &str, old: PlegState, new: PlegState, out: &mut Vec<PodLifecycleEvent>) {
    if old == new {
        return;
    }
    let ev = |kind| PodLifecycleEvent { pod_uid: uid.to_string(), kind, data: id.to_string(), kernel_time_ns: None };
    match new {
        PlegState::Running => out.push(ev(PodLifecycleEventType::ContainerStarted)),
        PlegState::Exited => out.push(ev(PodLifecycleEventType::ContainerDied)),
        PlegState::Unknown => out.push(ev(PodLifecycleEventType::ContainerChanged)),
        PlegState::NonExistent => {
            if old != PlegState::Exited {
                out.push(ev(PodLifecycleEventType::ContainerDied));
            }
            out.push(ev(PodLifecycleEventType::ContainerRemoved));
        }
    }
}

/// Computes the events between two listings (pure; unit-tested).
#[must_use]
pub fn diff(old: &BTreeMap<String, RuntimePod>, new: &BTreeMap<String, RuntimePod>) -> Vec<PodLifecycleEvent> {
    let mut out = Vec::new();
    let uids: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for uid in uids {
        let o = old.get(uid).map(states).unwrap_or_default();
        let n = new.get(uid).map(states).unwrap_or_default();
        let ids: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
        for id in ids {
            let os = o.get(id).copied().unwrap_or(PlegState::NonExistent);
            let ns = n.get(id).copied().unwrap_or(PlegState::NonExistent);
            events_for(uid, id, os, ns, &mut out);
        }
    }
    out
}

#[derive(Debug, Default)]
struct Shared {
    last_relist: Option<Instant>,
    pods: BTreeMap<String, RuntimePod>,
    started: Option<Instant>,
}

/// The relisting PLEG.
#[derive(Debug, Clone)]
pub struct GenericPleg {
    rt: Arc<dyn RuntimeService>,
    metrics: Arc<KubeletMetrics>,
    period: Duration,
    threshold: Duration,
    shared: Arc<RwLock<Shared>>,
}

impl GenericPleg {
    #[must_use]
    pub fn new(
        rt: Arc<dyn RuntimeService>,
        metrics: Arc<KubeletMetrics>,
        period: Duration,
        threshold: Duration,
    ) -> Self {
        Self { rt, metrics, period, threshold, shared: Arc::default() }
    }

    /// The runtime's pods as of the last successful relist.
    #[must_use]
    pub fn runtime_pods(&self) -> BTreeMap<String, RuntimePod> {
        self.shared.read().unwrap().pods.clone()
    }

    /// The name of container `id` of pod `pod_uid` as of the last relist, without
    /// copying the snapshot (called for every kernel event).
    #[must_use]
    pub fn container_name(&self, pod_uid: &str, id: &str) -> Option<String> {
        self.shared.read().unwrap().pods.get(pod_uid)?.containers.get(id).map(|(name, _)| name.clone())
    }

    /// Whether at least one relist has completed.
    #[must_use]
    pub fn has_relisted(&self) -> bool {
        self.shared.read().unwrap().last_relist.is_some()
    }

    /// One relist: list, diff, publish. Returns the events (already sent to `tx`).
    pub async fn relist(
        &self,
        tx: &mpsc::Sender<PodLifecycleEvent>,
    ) -> crate::container::Result<Vec<PodLifecycleEvent>> {
        let events = self.relist_events().await?;
        for e in &events {
            if tx.try_send(e.clone()).is_err() {
                // Upstream drops events when the channel is full; the periodic sync repairs.
                self.metrics.pleg_discard_events.inc();
            }
        }
        Ok(events)
    }

    /// One relist without sending: list, diff against the previous listing, publish the
    /// snapshot and metrics, and return the events.
    pub async fn relist_events(&self) -> crate::container::Result<Vec<PodLifecycleEvent>> {
        let start = Instant::now();
        {
            let s = self.shared.read().unwrap();
            if let Some(prev) = s.last_relist {
                self.metrics.pleg_relist_interval.observe(start.duration_since(prev).as_secs_f64());
            }
        }
        let pods = RuntimePod::list_all(self.rt.as_ref()).await?;
        let events = {
            let mut s = self.shared.write().unwrap();
            let events = if s.last_relist.is_some() {
                diff(&s.pods, &pods)
            } else {
                // First listing after start: every existing container is news for the
                // sync loop (it adopts what runs), so diff against nothing.
                diff(&BTreeMap::new(), &pods)
            };
            s.pods = pods;
            s.last_relist = Some(start);
            events
        };
        self.update_running_metrics();
        self.metrics.pleg_relist_duration.observe(start.elapsed().as_secs_f64());
        self.metrics.pleg_last_seen.set(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()));
        Ok(events)
    }

    fn update_running_metrics(&self) {
        let s = self.shared.read().unwrap();
        let running_pods = s.pods.values().filter(|p| p.sandboxes.values().any(|r| *r)).count();
        self.metrics.running_pods.set(running_pods as i64);
        let mut by_state: BTreeMap<&'static str, i64> =
            ["created", "running", "exited", "unknown"].into_iter().map(|k| (k, 0)).collect();
        for p in s.pods.values() {
            for (_, st) in p.containers.values() {
                *by_state.entry(st.as_metric_label()).or_default() += 1;
            }
        }
        for (state, n) in by_state {
            self.metrics
                .running_containers
                .get_or_create(&ContainerStateLabels { container_state: state.into() })
                .set(n);
        }
    }

    /// Relists every period until shutdown.
    pub async fn run(self, tx: mpsc::Sender<PodLifecycleEvent>, shutdown: CancellationToken) {
        self.shared.write().unwrap().started = Some(Instant::now());
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = self.relist(&tx).await {
                tracing::warn!(error = %e, "PLEG relist failed");
            }
        }
    }
}

impl PodLifecycleEventGenerator for GenericPleg {
    fn healthy(&self) -> Result<(), String> {
        let s = self.shared.read().unwrap();
        let since = s.last_relist.or(s.started).map(|t| t.elapsed());
        match since {
            Some(d) if d > self.threshold => Err(format!(
                "pleg was last seen active {:.1}s ago; threshold is {}s",
                d.as_secs_f64(),
                self.threshold.as_secs()
            )),
            _ => Ok(()),
        }
    }

    fn period(&self) -> Duration {
        self.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::fake::FakeRuntime;

    fn pod(containers: &[(&str, ContainerState)], sandboxes: &[(&str, bool)]) -> RuntimePod {
        RuntimePod {
            uid: "u".into(),
            containers: containers.iter().map(|(id, s)| ((*id).to_string(), ("c".to_string(), *s))).collect(),
            sandboxes: sandboxes.iter().map(|(id, r)| ((*id).to_string(), *r)).collect(),
            ..Default::default()
        }
    }

    fn kinds(ev: &[PodLifecycleEvent]) -> Vec<(PodLifecycleEventType, String)> {
        ev.iter().map(|e| (e.kind, e.data.clone())).collect()
    }

    #[test]
    fn transitions() {
        use PodLifecycleEventType::*;
        let a = BTreeMap::from([("u".to_string(), pod(&[("c1", ContainerState::Running)], &[("s", true)]))]);
        let b = BTreeMap::from([(
            "u".to_string(),
            pod(&[("c1", ContainerState::Exited), ("c2", ContainerState::Created)], &[("s", true)]),
        )]);
        assert_eq!(kinds(&diff(&a, &b)), vec![(ContainerDied, "c1".into()), (ContainerChanged, "c2".into())]);
        let c = BTreeMap::from([("u".to_string(), pod(&[("c2", ContainerState::Running)], &[("s", false)]))]);
        assert_eq!(
            kinds(&diff(&b, &c)),
            vec![(ContainerRemoved, "c1".into()), (ContainerStarted, "c2".into()), (ContainerDied, "s".into())]
        );
        // A running container that vanished died and was removed.
        assert_eq!(
            kinds(&diff(&c, &BTreeMap::new())),
            vec![(ContainerDied, "c2".into()), (ContainerRemoved, "c2".into()), (ContainerRemoved, "s".into())]
        );
        assert!(diff(&c, &c).is_empty());
    }

    /// The evented PLEG's observations name containers from the last listing (once per
    /// kernel event: looked up in place, the snapshot is not copied).
    #[test]
    fn container_names_come_from_the_last_listing() {
        let pleg = GenericPleg::new(
            Arc::new(FakeRuntime::default()),
            Arc::new(KubeletMetrics::unregistered()),
            RELIST_PERIOD,
            RELIST_THRESHOLD,
        );
        pleg.shared.write().unwrap().pods.insert("u".into(), pod(&[("c1", ContainerState::Running)], &[]));
        assert_eq!(pleg.container_name("u", "c1").as_deref(), Some("c"));
        assert_eq!(pleg.container_name("u", "c2"), None);
        assert_eq!(pleg.container_name("v", "c1"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn health_follows_relists() {
        let rt = Arc::new(FakeRuntime::default());
        let pleg = GenericPleg::new(rt, Arc::new(KubeletMetrics::unregistered()), RELIST_PERIOD, RELIST_THRESHOLD);
        let (tx, _rx) = mpsc::channel(10);
        pleg.relist(&tx).await.unwrap();
        assert!(pleg.healthy().is_ok());
        tokio::time::advance(Duration::from_secs(181)).await;
        let err = pleg.healthy().unwrap_err();
        assert!(err.contains("threshold is 180s"), "{err}");
        pleg.relist(&tx).await.unwrap();
        assert!(pleg.healthy().is_ok());
    }
}
