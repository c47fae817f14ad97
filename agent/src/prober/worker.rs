//! One probe worker (upstream `worker.go`): the periodic loop and `doProbe`. See the
//! module docs of [`super`] for the rules.

use std::sync::Arc;
use std::time::Duration;

use crate::container::helpers::{container_should_restart, should_all_containers_restart};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus, Probe};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::metrics::WorkerLabels;
use super::probe::{self, Target};
use super::{
    Inner, ProbeKey, ProbeResult, ProbeType, ProbeUpdate, bare_container_id, kill_message, status_container_id,
};

pub(super) struct Worker {
    mgr: Arc<Inner>,
    key: ProbeKey,
    generation: u64,
    pod: Arc<Pod>,
    container: Container,
    /// A restartable init container.
    sidecar: bool,
    /// The probe, with API defaults applied.
    spec: Probe,
    period: Duration,
    labels: WorkerLabels,
    /// The container id (`containerd://<id>`) the worker last saw.
    container_id: Option<String>,
    last_result: Option<ProbeResult>,
    /// How many times in a row `last_result` came in.
    result_run: i32,
    /// Set after a verdict that will restart the container (or, for startup, any
    /// verdict): no probing until the container id changes.
    on_hold: bool,
}

impl Worker {
    pub(super) fn new(
        mgr: Arc<Inner>,
        key: ProbeKey,
        generation: u64,
        pod: Arc<Pod>,
        container: Container,
        sidecar: bool,
        spec: Probe,
    ) -> Self {
        let period = Duration::from_secs(spec.period_seconds.unwrap_or(10).max(1) as u64);
        let labels = WorkerLabels::new(
            key.probe_type,
            &container.name,
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            &key.pod_uid,
        );
        Self {
            mgr,
            key,
            generation,
            pod,
            container,
            sidecar,
            spec,
            period,
            labels,
            container_id: None,
            last_result: None,
            result_run: 0,
            on_hold: false,
        }
    }

    fn probe_type(&self) -> ProbeType {
        self.key.probe_type
    }

    /// Probes until stopped or until `do_probe` says the container is done for good.
    pub(super) async fn run(mut self, stop: CancellationToken, trigger: Arc<Notify>) {
        // Workers of pods found at start-up would all probe at once: spread them over
        // one period.
        if self.period > self.mgr.start.elapsed() {
            let delay = self.period.mul_f64((self.mgr.jitter)().clamp(0.0, 1.0));
            tokio::select! {
                () = stop.cancelled() => {
                    self.cleanup();
                    return;
                }
                () = tokio::time::sleep(delay) => {}
            }
        }
        let mut ticker = tokio::time::interval_at(Instant::now() + self.period, self.period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            let keep_going = tokio::select! {
                biased;
                () = stop.cancelled() => false,
                keep = self.do_probe() => keep,
            };
            if !keep_going {
                break;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = trigger.notified() => {
                    // The next periodic probe is one period after this one.
                    ticker.reset();
                }
                _ = ticker.tick() => {}
            }
        }
        self.cleanup();
    }

    fn cleanup(&self) {
        if let Some(id) = &self.container_id {
            self.mgr.cache(self.probe_type()).remove(id);
        }
        self.mgr.remove_worker(&self.key, self.generation);
        self.labels.remove(&self.mgr.metrics);
        tracing::debug!(pod = %self.key.pod_uid, container = %self.container.name, probe_type = %self.probe_type(), "probe worker stopped");
    }

    /// Publishes a result; sends an update when it changed.
    fn set_result(&self, result: ProbeResult) {
        let Some(id) = &self.container_id else { return };
        if self.mgr.cache(self.probe_type()).set(id, result) {
            let grace = match self.probe_type() {
                ProbeType::Readiness => None,
                _ => self.spec.termination_grace_period_seconds,
            };
            let _ = self.mgr.updates_tx.send(ProbeUpdate {
                pod_uid: self.key.pod_uid.clone(),
                container_name: self.container.name.clone(),
                container_id: id.clone(),
                probe_type: self.probe_type(),
                result,
                termination_grace_period_seconds: grace,
            });
        }
    }

    /// The container's status: among the regular containers, else the init ones.
    fn find_status(status: &PodStatus, name: &str) -> Option<ContainerStatus> {
        let find = |list: Option<&Vec<ContainerStatus>>| {
            list.into_iter().flatten().find(|s| s.name == name && status_container_id(s).is_some()).cloned()
        };
        find(status.container_statuses.as_ref()).or_else(|| find(status.init_container_statuses.as_ref()))
    }

    /// One round: decides whether to probe, probes, applies the thresholds. Returns
    /// whether the worker should keep going.
    async fn do_probe(&mut self) -> bool {
        let Some(status) = self.mgr.status(&self.key.pod_uid) else {
            // Not created yet, or already gone.
            return true;
        };
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            tracing::debug!(pod = %self.key.pod_uid, phase = ?status.phase, "pod is terminated, exiting probe worker");
            return false;
        }
        let Some(c) = Self::find_status(&status, &self.container.name) else {
            // The container does not exist yet (or any more): wait.
            return true;
        };
        let id = status_container_id(&c).unwrap_or_default().to_string();
        if self.container_id.as_deref() != Some(id.as_str()) {
            if let Some(old) = &self.container_id {
                self.mgr.cache(self.probe_type()).remove(old);
            }
            self.container_id = Some(id.clone());
            self.set_result(self.probe_type().initial_result());
            // A new container: probe it from scratch.
            self.on_hold = false;
            self.last_result = None;
            self.result_run = 0;
        }
        if self.on_hold {
            return true;
        }
        let state = c.state.unwrap_or_default();
        let Some(running) = state.running else {
            self.set_result(ProbeResult::Failure);
            // Stop for good if the container will not run again: it exited for good, and
            // no exit asks for all the pod's containers to restart.
            let Some(terminated) = state.terminated else { return true };
            return self.sidecar
                || self.pod.spec.as_ref().is_some_and(|spec| {
                    container_should_restart(&self.container, spec, terminated.exit_code)
                        || should_all_containers_restart(spec, None, Some(&status))
                });
        };
        if self.pod.metadata.deletion_timestamp.is_some() && self.probe_type() != ProbeType::Readiness {
            if self.probe_type() == ProbeType::Startup {
                tracing::info!(pod = %self.key.pod_uid, container = %self.container.name, "pod deletion requested before container has fully started");
            }
            // Let the container shut down quietly.
            self.set_result(ProbeResult::Success);
            return false;
        }
        if let Some(started_at) = running.started_at {
            let since = self.mgr.clock.now().duration_since(started_at.0).as_secs();
            if since < i64::from(self.spec.initial_delay_seconds.unwrap_or(0)) {
                return true;
            }
        }
        let started = self.mgr.is_started(&self.key.pod_uid, &self.container.name, &id);
        if started == (self.probe_type() == ProbeType::Startup) {
            // Startup probes run until the container started, the others after.
            return true;
        }

        let Some(result) = self.probe(&status, &id).await else {
            // The probe errored: this run does not count.
            return true;
        };

        if self.last_result == Some(result) {
            self.result_run += 1;
        } else {
            self.last_result = Some(result);
            self.result_run = 1;
        }
        let threshold = match result {
            ProbeResult::Failure => self.spec.failure_threshold.unwrap_or(3),
            _ => self.spec.success_threshold.unwrap_or(1),
        };
        if self.result_run < threshold {
            return true;
        }
        self.set_result(result);
        let fatal = match self.probe_type() {
            ProbeType::Liveness => result == ProbeResult::Failure,
            // Started, or failed (then restarted): nothing more to find out.
            ProbeType::Startup => true,
            ProbeType::Readiness => false,
        };
        if fatal {
            if result == ProbeResult::Failure {
                let (message, _) = kill_message(&self.pod, &self.container, self.probe_type(), self.sidecar);
                tracing::info!(pod = %self.key.pod_uid, container = %self.container.name, probe_type = %self.probe_type(), "{message}");
            }
            self.on_hold = true;
            self.result_run = 0;
        }
        true
    }

    /// Runs the probe in a `probe` span (exported with the pod's uid when tracing is on)
    /// and records the metrics. `None` when it errored.
    async fn probe(&self, status: &PodStatus, id: &str) -> Option<ProbeResult> {
        // Exported as an OpenTelemetry span when tracing is on (a root span per run).
        let span = tracing::info_span!(
            target: crate::telemetry::SPAN_TARGET,
            "probe",
            probe_type = %self.probe_type(),
            k8s.pod.uid = self.pod.metadata.uid.as_deref().unwrap_or_default(),
            pod = self.pod.metadata.name.as_deref().unwrap_or_default(),
            namespace = self.pod.metadata.namespace.as_deref().unwrap_or_default(),
            container = %self.container.name,
            result = tracing::field::Empty,
            duration = tracing::field::Empty,
        );
        let target =
            Target { probe_type: self.probe_type(), pod: &self.pod, container: &self.container, probe: &self.spec };
        let begin = Instant::now();
        let outcome = probe::run(&self.mgr, target, status, bare_container_id(id)).instrument(span.clone()).await;
        let elapsed = begin.elapsed();
        span.record("duration", elapsed.as_secs_f64());
        let Ok(result) = outcome else {
            span.record("result", "Error");
            return None;
        };
        span.record("result", result.as_str());
        let success = match result {
            ProbeResult::Success | ProbeResult::Warning => Some(true),
            ProbeResult::Failure => Some(false),
            ProbeResult::Unknown => None,
        };
        self.labels.observe(&self.mgr.metrics, success, elapsed);
        Some(result)
    }
}
