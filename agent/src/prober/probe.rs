//! One probe run as upstream's `prober.probe` does it: the runner is retried while it
//! errors (three attempts in all), a failure or error is reported as an `Unhealthy`
//! warning event on the container (`Liveness probe failed: <output>`, `Liveness probe
//! errored and resulted in unknown state: <error>`), a warning as a `ProbeWarning`
//! event, and the outcome is reduced to `Success` or `Failure` (or an error, which the
//! worker throws away).
//!
//! As in 1.28, an `Unknown` result without an error is a failure with an `Unhealthy`
//! event; newer upstream versions count it as a failure without the event.

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Probe};

use super::{Inner, ProbeResult, ProbeType};
use crate::events::EventType;

/// Upstream `events.ContainerUnhealthy`.
pub const REASON_UNHEALTHY: &str = "Unhealthy";
/// Upstream `events.ContainerProbeWarning`.
pub const REASON_PROBE_WARNING: &str = "ProbeWarning";

/// What one probe run is about.
#[derive(Debug, Clone, Copy)]
pub(super) struct Target<'a> {
    pub probe_type: ProbeType,
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub probe: &'a Probe,
}

/// Runs the probe; `Ok` is `Success` or `Failure`, `Err` the error of the last attempt.
pub(super) async fn run(
    inner: &Inner,
    t: Target<'_>,
    status: &PodStatus,
    container_id: &str,
) -> Result<ProbeResult, String> {
    let mut outcome = None;
    for _ in 0..crate::probe::MAX_PROBE_RETRIES {
        let o = inner.runner.run(t.probe_type, t.pod, status, t.container, container_id, t.probe).await;
        let errored = o.error.is_some();
        outcome = Some(o);
        if !errored {
            break;
        }
    }
    let outcome = outcome.expect("at least one attempt");
    let object = || crate::events::container_ref(t.pod, &t.container.name);
    let pod = t.pod.metadata.name.as_deref().unwrap_or_default();
    let container = t.container.name.as_str();
    if let Some(error) = outcome.error {
        tracing::debug!(probe_type = %t.probe_type, pod, container, %error, "probe errored");
        inner.recorder.record(
            object(),
            EventType::Warning,
            REASON_UNHEALTHY,
            format!("{} probe errored and resulted in {} state: {error}", t.probe_type, result_name(outcome.result)),
        );
        return Err(error);
    }
    match outcome.result {
        ProbeResult::Success => {
            tracing::trace!(probe_type = %t.probe_type, pod, container, "probe succeeded");
            Ok(ProbeResult::Success)
        }
        ProbeResult::Warning => {
            inner.recorder.record(
                object(),
                EventType::Warning,
                REASON_PROBE_WARNING,
                format!("{} probe warning: {}", t.probe_type, outcome.output),
            );
            tracing::debug!(probe_type = %t.probe_type, pod, container, output = %outcome.output, "probe succeeded with a warning");
            Ok(ProbeResult::Success)
        }
        result @ (ProbeResult::Failure | ProbeResult::Unknown) => {
            tracing::debug!(probe_type = %t.probe_type, pod, container, ?result, output = %outcome.output, "probe failed");
            inner.recorder.record(
                object(),
                EventType::Warning,
                REASON_UNHEALTHY,
                format!("{} probe failed: {}", t.probe_type, outcome.output),
            );
            Ok(ProbeResult::Failure)
        }
    }
}

/// The result as upstream's `probe.Result` reads in messages.
fn result_name(result: ProbeResult) -> &'static str {
    match result {
        ProbeResult::Success => "success",
        ProbeResult::Warning => "warning",
        ProbeResult::Failure => "failure",
        ProbeResult::Unknown => "unknown",
    }
}
