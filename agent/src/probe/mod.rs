//! Container probes (upstream `pkg/probe` and `runProbe` of `pkg/kubelet/prober/prober.go`):
//! the four handlers and the code that turns a `v1.Probe` into a handler call.
//!
//! - [`exec`]: `ExecSync` in the container with the probe's timeout; exit code 0 is
//!   success, another code a failure with the output, a timeout a failure with
//!   `command timed out: ...`, any other runtime error an error (`Unknown`).
//! - [`http`]: a `GET` from the node (insecure TLS for `HTTPS`), 200–399 is success, a 3xx
//!   that was not followed a warning; redirects are followed to the same host only.
//! - [`tcp`]: a TCP connect within the timeout.
//! - [`grpc`]: `grpc.health.v1.Health/Check`, `SERVING` is success.
//!
//! [`Prober::run_probe`] picks the handler as upstream does (exec, httpGet, tcpSocket,
//! grpc, in that order): the host defaults to the pod IP (`status.podIP`), a port may be
//! a container port's name, the exec command gets `$(VAR)` expansion of the container's
//! static `env` (upstream `ExpandContainerCommandOnlyStatic`), and `timeoutSeconds`
//! defaults to 1. A handler returns `(result, output)` or an error that carries its own
//! result, like upstream's `(probe.Result, string, error)`; the prober's workers retry
//! errors (not failures) up to [`MAX_PROBE_RETRIES`] runs, as upstream.
//!
//! Messages follow upstream's Go text (`Get "url": ...`, `dial tcp addr: connect: connection
//! refused`, ...) so events read the same. Deviations: HTTPS probes speak HTTP/1.1 only (Go
//! may negotiate HTTP/2 by ALPN); the alpha fields `httpGet.protocol` and `grpc.mode`
//! (feature gates off by default) are ignored.

pub mod exec;
pub(crate) mod format;
pub mod grpc;
pub mod http;
pub mod tcp;
#[cfg(test)]
pub(crate) mod test_server;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodStatus, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::container::RuntimeService;
use crate::types::expansion;
use crate::types::pod::pod_full_name;

/// The Kubernetes version whose behaviour swiftlet implements, as `major.minor` (the
/// probe `User-Agent` is `kube-probe/<major>.<minor>`).
pub const KUBE_VERSION_MAJOR_MINOR: &str = "1.37";

/// `timeoutSeconds` when the probe does not set it (the API default).
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 1;

/// How often a probe that errors is run again before its error counts (upstream
/// `maxProbeRetries`).
pub const MAX_PROBE_RETRIES: usize = 3;

/// `User-Agent` of the kubelet's requests for `purpose` (`probe` or `lifecycle`).
#[must_use]
pub fn user_agent(purpose: &str) -> String {
    format!("kube-{purpose}/{KUBE_VERSION_MAJOR_MINOR}")
}

/// The result of one probe run (upstream `probe.Result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// The container passed.
    Success,
    /// Passed, with something to report (an HTTP redirect that was not followed).
    Warning,
    /// The container failed.
    Failure,
    /// The probe could not tell (for example: the runtime failed).
    Unknown,
}

impl std::fmt::Display for ProbeResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProbeResult::Success => "success",
            ProbeResult::Warning => "warning",
            ProbeResult::Failure => "failure",
            ProbeResult::Unknown => "unknown",
        })
    }
}

/// A probe that ran: its result and output (the body, the command's output, or why it
/// failed; upstream puts it into `Unhealthy` and `ProbeWarning` events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub result: ProbeResult,
    pub output: String,
}

impl Outcome {
    #[must_use]
    pub fn new(result: ProbeResult, output: impl Into<String>) -> Self {
        Self { result, output: output.into() }
    }

    #[must_use]
    pub fn success(output: impl Into<String>) -> Self {
        Self::new(ProbeResult::Success, output)
    }

    #[must_use]
    pub fn failure(output: impl Into<String>) -> Self {
        Self::new(ProbeResult::Failure, output)
    }
}

/// A probe that errored (upstream's non-nil `error`): the result it came with (mostly
/// [`ProbeResult::Unknown`]) and the message. The prober retries these and reports
/// `<type> probe errored and resulted in <result> state: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProbeError {
    pub result: ProbeResult,
    pub message: String,
}

impl ProbeError {
    #[must_use]
    pub fn unknown(message: impl Into<String>) -> Self {
        Self { result: ProbeResult::Unknown, message: message.into() }
    }
}

/// What a probe handler returns.
pub type ProbeResponse = Result<Outcome, ProbeError>;

/// Resolves a probe or hook port (upstream `probe.ResolveContainerPort`): a number, the
/// name of one of the container's ports, or a number written as a string; 1–65535.
pub fn resolve_container_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let named = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port));
            match named {
                Some(n) => n,
                None => format::atoi(name)?,
            }
        }
    };
    if number > 0 && number < 65536 { Ok(number as u16) } else { Err(format!("invalid port number: {number}")) }
}

/// `$(VAR)` expansion of a probe's exec command over the container's `env` values as
/// written (upstream `ExpandContainerCommandOnlyStatic`): a variable set with `valueFrom`
/// expands to the empty string, an unknown one stays as written.
#[must_use]
pub fn expand_command_static(command: &[String], env_vars: &[EnvVar]) -> Vec<String> {
    let vars: HashMap<&str, &str> =
        env_vars.iter().map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default())).collect();
    command.iter().map(|c| expansion::expand(c, &vars)).collect()
}

/// The probe's timeout (`timeoutSeconds`, default 1).
#[must_use]
pub fn probe_timeout(probe: &Probe) -> Duration {
    let secs = probe.timeout_seconds.filter(|s| *s > 0).unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    Duration::from_secs(secs as u64)
}

/// Runs probes of containers: holds the runtime (for exec probes) and the HTTP client.
#[derive(Debug, Clone)]
pub struct Prober {
    runtime: Arc<dyn RuntimeService>,
    http: http::HttpProber,
}

impl Prober {
    #[must_use]
    pub fn new(runtime: Arc<dyn RuntimeService>) -> Self {
        Self { runtime, http: http::HttpProber::new() }
    }

    /// Runs `probe` once for `container` of `pod` (upstream `runProbe`). `status` gives the
    /// pod IP; `container_id` is the CRI id of the running container (a `<runtime>://`
    /// prefix is accepted and dropped).
    pub async fn run_probe(
        &self,
        probe: &Probe,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
    ) -> ProbeResponse {
        let timeout = probe_timeout(probe);
        let pod_ip = status.pod_ip.as_deref().unwrap_or_default();
        if let Some(action) = &probe.exec {
            let command = expand_command_static(
                action.command.as_deref().unwrap_or_default(),
                container.env.as_deref().unwrap_or_default(),
            );
            let id = container_id.split_once("://").map_or(container_id, |(_, id)| id);
            return exec::probe(self.runtime.as_ref(), id, &command, timeout).await;
        }
        if let Some(action) = &probe.http_get {
            let request =
                http::HttpGetRequest::for_action(action, container, pod_ip, "probe").map_err(ProbeError::unknown)?;
            return self.http.probe(&request, timeout).await;
        }
        if let Some(action) = &probe.tcp_socket {
            let port = resolve_container_port(&action.port, container).map_err(ProbeError::unknown)?;
            let host = action.host.as_deref().filter(|h| !h.is_empty()).unwrap_or(pod_ip);
            return tcp::probe(host, port, timeout).await;
        }
        if let Some(action) = &probe.grpc {
            let service = action.service.as_deref().unwrap_or_default();
            return grpc::probe(pod_ip, service, action.port, timeout).await;
        }
        let name = &container.name;
        Err(ProbeError::unknown(format!("missing probe handler for {}:{name}", pod_full_name(pod))))
    }
}

#[cfg(test)]
mod tests;
