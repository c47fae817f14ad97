//! [`GenericPleg`]: the relisting PLEG. Every period (1 s) it lists sandboxes and
//! containers (two CRI calls), diffs each container's state against the previous
//! listing and emits one event per change. It counts as unhealthy when no relist
//! completed within the threshold (3 min), which `/healthz` reports.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::metrics::{ContainerStateLabels, PlegMetrics};
use super::{PodLifecycleEvent, PodLifecycleEventGenerator, PodLifecycleEventType};
use crate::container::cache::RuntimeCache;
use crate::container::{ContainerState, RuntimePod, RuntimeService};

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

/// The relisting PLEG. Its listing goes to the [`RuntimeCache`], where housekeeping and
/// the evented PLEG read it.
#[derive(Debug, Clone)]
pub struct GenericPleg {
    rt: Arc<dyn RuntimeService>,
    metrics: Arc<PlegMetrics>,
    period: Duration,
    threshold: Duration,
    cache: Arc<RuntimeCache>,
    /// When [`Self::run`] began (the health clock before the first relist).
    started: Arc<RwLock<Option<Instant>>>,
    /// Why it runs alone, without the kernel's events (for [`PodLifecycleEventGenerator::describe`]).
    fallback: Option<String>,
}

impl GenericPleg {
    #[must_use]
    pub fn new(
        rt: Arc<dyn RuntimeService>,
        metrics: Arc<PlegMetrics>,
        cache: Arc<RuntimeCache>,
        period: Duration,
        threshold: Duration,
    ) -> Self {
        Self { rt, metrics, period, threshold, cache, started: Arc::default(), fallback: None }
    }

    /// Marks it as the whole PLEG because the evented one could not run, for `why`.
    #[must_use]
    pub fn with_fallback_reason(mut self, why: String) -> Self {
        self.fallback = Some(why);
        self
    }

    /// The cache it writes.
    #[must_use]
    pub fn cache(&self) -> &Arc<RuntimeCache> {
        &self.cache
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
        // Only this PLEG writes the listing: it cannot change until the set below.
        let previous = self.cache.listed_at();
        if let Some(prev) = previous {
            self.metrics.pleg_relist_interval.observe(start.duration_since(prev).as_secs_f64());
        }
        let pods = RuntimePod::list_all(self.rt.as_ref()).await?;
        let events = match previous {
            Some(_) => self.cache.with_listing(|old| diff(old, &pods)),
            // First listing after start: every existing container is news for the sync
            // loop (it adopts what runs), so diff against nothing.
            None => diff(&BTreeMap::new(), &pods),
        };
        self.cache.set_listing(pods, start);
        self.update_running_metrics();
        self.metrics.pleg_relist_duration.observe(start.elapsed().as_secs_f64());
        self.metrics.pleg_last_seen.set(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()));
        Ok(events)
    }

    fn update_running_metrics(&self) {
        let (running_pods, by_state) = self.cache.with_listing(|pods| {
            let running_pods = pods.values().filter(|p| p.sandboxes.values().any(|r| *r)).count();
            let mut by_state: BTreeMap<&'static str, i64> =
                ["created", "running", "exited", "unknown"].into_iter().map(|k| (k, 0)).collect();
            for p in pods.values() {
                for (_, st) in p.containers.values() {
                    *by_state.entry(st.as_metric_label()).or_default() += 1;
                }
            }
            (running_pods, by_state)
        });
        self.metrics.running_pods.set(running_pods as i64);
        for (state, n) in by_state {
            self.metrics
                .running_containers
                .get_or_create(&ContainerStateLabels { container_state: state.into() })
                .set(n);
        }
    }

    /// Relists every period until shutdown.
    pub async fn run(self, tx: mpsc::Sender<PodLifecycleEvent>, shutdown: CancellationToken) {
        *self.started.write().unwrap() = Some(Instant::now());
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
        let started = *self.started.read().unwrap();
        let since = self.cache.listed_at().or(started).map(|t| t.elapsed());
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

    fn describe(&self) -> String {
        let every = format!("relisting only, every {}s", self.period.as_secs());
        match &self.fallback {
            Some(why) => format!("{every}: {why}"),
            None => every,
        }
    }

    fn start(&self, tx: mpsc::Sender<PodLifecycleEvent>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().run(tx, shutdown))
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

    /// Its listing lands in the cache that housekeeping and the evented PLEG read.
    #[tokio::test]
    async fn the_listing_goes_to_the_cache() {
        let rt = Arc::new(FakeRuntime::default());
        let cache = Arc::new(RuntimeCache::default());
        let pleg = GenericPleg::new(
            rt.clone(),
            Arc::new(PlegMetrics::default()),
            cache.clone(),
            RELIST_PERIOD,
            RELIST_THRESHOLD,
        );
        let (tx, _rx) = mpsc::channel(10);
        assert!(!cache.has_listed());
        pleg.relist(&tx).await.unwrap();
        assert!(cache.has_listed());
        assert!(cache.runtime_pods().is_empty());
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": []}
        }))
        .unwrap();
        let config = crate::container::api::PodSandboxConfig {
            metadata: Some(crate::container::api::PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: crate::container::labels::sandbox_labels(&p),
            ..Default::default()
        };
        let sandbox = rt.run_pod_sandbox(config, String::new()).await.unwrap();
        let events = pleg.relist(&tx).await.unwrap();
        assert_eq!(kinds(&events), vec![(PodLifecycleEventType::ContainerStarted, sandbox.clone())]);
        assert_eq!(cache.runtime_pods()["u"].sandboxes.get(&sandbox), Some(&true));
    }

    /// What `/healthz` says of it, alone after the evented PLEG could not load.
    #[test]
    fn it_says_what_it_is_and_why() {
        let pleg = GenericPleg::new(
            Arc::new(FakeRuntime::default()),
            Arc::new(PlegMetrics::default()),
            Arc::default(),
            RELIST_PERIOD,
            RELIST_THRESHOLD,
        );
        assert_eq!(pleg.describe(), "relisting only, every 1s");
        let pleg = pleg.with_fallback_reason("disabled by --evented-pleg=false".into());
        assert_eq!(pleg.describe(), "relisting only, every 1s: disabled by --evented-pleg=false");
    }

    #[tokio::test(start_paused = true)]
    async fn health_follows_relists() {
        let rt = Arc::new(FakeRuntime::default());
        let pleg =
            GenericPleg::new(rt, Arc::new(PlegMetrics::default()), Arc::default(), RELIST_PERIOD, RELIST_THRESHOLD);
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
