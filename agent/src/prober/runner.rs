//! [`HandlerRunner`]: the real [`ProbeRunner`], over the handlers of [`crate::probe`]
//! (exec through CRI `ExecSync`, HTTP, TCP and gRPC from the node).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Probe};

use super::{ProbeOutcome, ProbeResult, ProbeRunner, ProbeType};
use crate::container::RuntimeService;
use crate::probe::{self, Prober};

/// Runs probes with the real handlers. The worker retries errors, so one call is one run.
#[derive(Debug)]
pub struct HandlerRunner {
    prober: Prober,
}

impl HandlerRunner {
    #[must_use]
    pub fn new(runtime: Arc<dyn RuntimeService>) -> Self {
        Self { prober: Prober::new(runtime) }
    }
}

/// The worker's view of a handler's answer: an error (the probe could not run) is
/// thrown away after retries, whatever result it carries, as upstream.
fn outcome(response: probe::ProbeResponse) -> ProbeOutcome {
    let result = |r| match r {
        probe::ProbeResult::Success => ProbeResult::Success,
        probe::ProbeResult::Warning => ProbeResult::Warning,
        probe::ProbeResult::Failure => ProbeResult::Failure,
        probe::ProbeResult::Unknown => ProbeResult::Unknown,
    };
    match response {
        Ok(o) => ProbeOutcome { result: result(o.result), output: o.output, error: None },
        Err(e) => ProbeOutcome::errored(result(e.result), e.message),
    }
}

#[async_trait]
impl ProbeRunner for HandlerRunner {
    async fn run(
        &self,
        _probe_type: ProbeType,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
        probe: &Probe,
    ) -> ProbeOutcome {
        outcome(self.prober.run_probe(probe, pod, status, container, container_id).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_answers_map_to_worker_outcomes() {
        let ok = |r| outcome(Ok(probe::Outcome::new(r, "out")));
        assert_eq!(ok(probe::ProbeResult::Success).result, ProbeResult::Success);
        assert_eq!(ok(probe::ProbeResult::Warning).result, ProbeResult::Warning);
        assert_eq!(ok(probe::ProbeResult::Failure).result, ProbeResult::Failure);
        assert_eq!(ok(probe::ProbeResult::Unknown).result, ProbeResult::Unknown);
        assert_eq!(ok(probe::ProbeResult::Failure).output, "out");
        let err = outcome(Err(probe::ProbeError::unknown("dial failed")));
        assert_eq!(err.error.as_deref(), Some("dial failed"));
        assert_eq!(err.result, ProbeResult::Unknown);
        let err = outcome(Err(probe::ProbeError { result: probe::ProbeResult::Failure, message: "bad".into() }));
        assert_eq!((err.result, err.error.as_deref()), (ProbeResult::Failure, Some("bad")));
    }
}
