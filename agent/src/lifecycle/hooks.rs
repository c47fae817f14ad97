//! Container lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go` and the
//! preStop timing of `kuberuntime_container.go`): [`HandlerRunner::run`] runs a
//! `postStart` or `preStop` handler.
//!
//! - `exec`: the command through `ExecSync` with no timeout (upstream passes 0), not
//!   expanded; a non-zero exit fails with `Exec lifecycle hook ([cmd]) for Container "c"
//!   in Pod "name_ns(uid)" failed - error: <err>, message: "<output>"`.
//! - `httpGet`: the request as a probe builds it (`User-Agent: kube-lifecycle/...`), to the
//!   pod's IP unless the action names a host, with no timeout, insecure TLS and same-host
//!   redirects. Only a request error fails (`HTTP lifecycle hook (<path>) ... failed -
//!   error: <err>`): the status code is not looked at, as upstream. An HTTPS request that a
//!   plain HTTP server answers is retried over HTTP without `Authorization`; when that
//!   works the hook succeeds and the caller records a `LifecycleHTTPFallback` warning
//!   ([`HookOutcome::http_fallback`]).
//! - `sleep`: waits `seconds`; cancelled early it fails with `container terminated before
//!   sleep hook finished`.
//! - `tcpSocket` (accepted by the API for compatibility, never run): fails with
//!   `Cannot run handler: invalid handler: &LifecycleHandler{...}`.
//!
//! The long messages are for logs and the container's sync result; the events upstream
//! records carry only [`FAILED_POST_START_HOOK_MESSAGE`] / [`FAILED_PRE_STOP_HOOK_MESSAGE`]
//! so that secrets in commands or output do not reach the API server.
//!
//! A preStop hook runs within the grace period ([`HandlerRunner::execute_pre_stop_hook`]);
//! the time it took, in whole seconds, comes off the grace period given to `StopContainer`,
//! which never gets less than [`MINIMUM_GRACE_PERIOD_SECONDS`]
//! ([`grace_period_after_pre_stop`]). Deviation: a hook still running when the grace
//! period ends is cancelled (upstream leaves its goroutine running until the container is
//! gone), so a failure after that point is not reported. The hook client is the probe
//! client (a connection per request, no `Accept-Encoding`), where upstream's keeps
//! connections alive and asks for gzip. With no pod IP, an `httpGet` hook
//! without a host fails with `failed to find networking container: the pod has no IP`
//! (upstream prints its whole runtime pod status there).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::container::RuntimeService;
use crate::probe::exec::run_in_container;
use crate::probe::format;
use crate::probe::http::{HttpClient, HttpGetRequest};
use crate::types::pod::pod_full_name;

/// The least grace period a container gets after its preStop hook (upstream
/// `minimumGracePeriodInSeconds`).
pub const MINIMUM_GRACE_PERIOD_SECONDS: i64 = 2;

/// Event reason when a postStart hook fails (the container is then killed).
pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
/// Message of the [`FAILED_POST_START_HOOK`] event (the details stay out of it).
pub const FAILED_POST_START_HOOK_MESSAGE: &str = "PostStartHook failed";
/// Event reason when a preStop hook fails.
pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
/// Message of the [`FAILED_PRE_STOP_HOOK`] event.
pub const FAILED_PRE_STOP_HOOK_MESSAGE: &str = "PreStopHook failed";
/// Reason of the pod's warning event when an HTTPS hook fell back to HTTP.
pub const LIFECYCLE_HTTP_FALLBACK: &str = "LifecycleHTTPFallback";

/// The container a hook runs for.
#[derive(Debug, Clone, Copy)]
pub struct HookContext<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    /// CRI id of the container (a `<runtime>://` prefix is accepted and dropped).
    pub container_id: &'a str,
    /// The pod's IPs from the runtime (the sandbox); the first is an `httpGet` hook's
    /// host when the action names none.
    pub pod_ips: &'a [String],
}

/// A hook that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HookError {
    /// Upstream's message (`Exec lifecycle hook (...) for Container ... failed - error:
    /// ...`), for logs and the container's sync result; not for events.
    pub message: String,
    /// The underlying error alone.
    pub error: String,
}

/// What running a hook gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookOutcome {
    pub result: Result<(), HookError>,
    /// Set when an HTTPS hook was answered in HTTP and the retry over HTTP worked: the
    /// message of the [`LIFECYCLE_HTTP_FALLBACK`] warning event to record on the pod.
    pub http_fallback: Option<String>,
}

impl HookOutcome {
    fn from(result: Result<(), HookError>) -> Self {
        Self { result, http_fallback: None }
    }
}

/// A preStop hook run within a grace period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreStopRun {
    /// How long it took in whole seconds (what comes off the grace period).
    pub elapsed_secs: i64,
    /// `None` when the grace period ended first (the hook was cancelled).
    pub outcome: Option<HookOutcome>,
}

/// The grace period left for `StopContainer` after a preStop hook that took
/// `pre_stop_elapsed_secs` (0 without a hook): never below
/// [`MINIMUM_GRACE_PERIOD_SECONDS`], as upstream `killContainer`.
#[must_use]
pub fn grace_period_after_pre_stop(grace_period_secs: i64, pre_stop_elapsed_secs: i64) -> i64 {
    grace_period_secs.saturating_sub(pre_stop_elapsed_secs).max(MINIMUM_GRACE_PERIOD_SECONDS)
}

/// Runs lifecycle handlers (upstream `handlerRunner`).
#[derive(Debug, Clone)]
pub struct HandlerRunner {
    runtime: Arc<dyn RuntimeService>,
    http: HttpClient,
}

impl HandlerRunner {
    #[must_use]
    pub fn new(runtime: Arc<dyn RuntimeService>) -> Self {
        Self { runtime, http: HttpClient::new() }
    }

    /// Runs `handler` for the container. `cancel` ends a sleep early (the container is
    /// being torn down); the caller drops the future to abandon the other kinds.
    pub async fn run(
        &self,
        ctx: &HookContext<'_>,
        handler: &LifecycleHandler,
        cancel: &CancellationToken,
    ) -> HookOutcome {
        let container = format::quote(&ctx.container.name);
        let pod = format::quote(&pod_full_name(ctx.pod));
        if let Some(exec) = &handler.exec {
            let command = exec.command.clone().unwrap_or_default();
            let id = ctx.container_id.split_once("://").map_or(ctx.container_id, |(_, id)| id);
            let (output, result) = run_in_container(self.runtime.as_ref(), id, &command, Duration::ZERO).await;
            return HookOutcome::from(result.map_err(|e| {
                let output = String::from_utf8_lossy(&output);
                HookError {
                    message: format!(
                        "Exec lifecycle hook ({}) for Container {container} in Pod {pod} failed - error: {e}, message: {}",
                        format::string_slice(&command),
                        format::quote(&output)
                    ),
                    error: e.to_string(),
                }
            }));
        }
        if let Some(action) = &handler.http_get {
            let (result, http_fallback) = self.run_http(ctx, handler).await;
            let path = action.path.as_deref().unwrap_or_default();
            let result = result.map_err(|error| HookError {
                message: format!(
                    "HTTP lifecycle hook ({path}) for Container {container} in Pod {pod} failed - error: {error}"
                ),
                error,
            });
            return HookOutcome { result, http_fallback };
        }
        if let Some(sleep) = &handler.sleep {
            let seconds = sleep.seconds;
            let result = tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(seconds.max(0) as u64)) => Ok(()),
                () = cancel.cancelled() => Err("container terminated before sleep hook finished".to_string()),
            };
            return HookOutcome::from(result.map_err(|error| HookError {
                message: format!(
                    "Sleep lifecycle hook ({seconds}) for Container {container} in Pod {pod} failed - error: {error}"
                ),
                error,
            }));
        }
        let error = format!("invalid handler: {}", go_handler(handler));
        HookOutcome::from(Err(HookError { message: format!("Cannot run handler: {error}"), error }))
    }

    /// Upstream `runHTTPHandler`: the error text, and the fallback event message.
    async fn run_http(
        &self,
        ctx: &HookContext<'_>,
        handler: &LifecycleHandler,
    ) -> (Result<(), String>, Option<String>) {
        let action = handler.http_get.as_ref().expect("an httpGet handler");
        let pod_ip = match action.host.as_deref().filter(|h| !h.is_empty()) {
            Some(host) => host,
            None => match ctx.pod_ips.first() {
                Some(ip) => ip.as_str(),
                None => return (Err("failed to find networking container: the pod has no IP".into()), None),
            },
        };
        let request = match HttpGetRequest::for_action(action, ctx.container, pod_ip, "lifecycle") {
            Ok(r) => r,
            Err(e) => return (Err(e), None),
        };
        let Err(err) = self.http.get(&request, None).await else {
            return (Ok(()), None);
        };
        if err.is_http_response_to_https() {
            tracing::debug!(host = %request.target.authority(), "HTTPS request to lifecycle hook got HTTP response, retrying with HTTP");
            let mut plain = request.clone();
            plain.target.scheme = "http".into();
            plain.headers.retain(|(n, _)| !n.eq_ignore_ascii_case("authorization"));
            if self.http.get(&plain, None).await.is_ok() {
                let message = format!(
                    "request to HTTPS lifecycle hook {} got HTTP response, retry with HTTP succeeded",
                    plain.target.authority()
                );
                return (Ok(()), Some(message));
            }
        }
        (Err(err.to_string()), None)
    }

    /// Runs a preStop hook for at most `grace_period_secs` (upstream
    /// `executePreStopHook`). Upstream runs it only when the grace period is positive;
    /// so does this (a zero period gives `elapsed_secs` 0 and no outcome).
    pub async fn execute_pre_stop_hook(
        &self,
        ctx: &HookContext<'_>,
        handler: &LifecycleHandler,
        grace_period_secs: i64,
        cancel: &CancellationToken,
    ) -> PreStopRun {
        if grace_period_secs <= 0 {
            return PreStopRun { elapsed_secs: 0, outcome: None };
        }
        let start = Instant::now();
        let hook_cancel = cancel.child_token();
        let grace = Duration::from_secs(grace_period_secs as u64);
        let outcome = tokio::time::timeout(grace, self.run(ctx, handler, &hook_cancel)).await.ok();
        hook_cancel.cancel();
        if outcome.is_none() {
            tracing::debug!(container = %ctx.container.name, grace_period_secs, "preStop hook not completed in grace period");
        }
        PreStopRun { elapsed_secs: start.elapsed().as_secs() as i64, outcome }
    }
}

/// Go's `%v` of a `*LifecycleHandler` that has no runnable action (the generated
/// `String()`); only `tcpSocket` can be set then.
fn go_handler(handler: &LifecycleHandler) -> String {
    let mut out = String::from("&LifecycleHandler{Exec:nil,HTTPGet:nil,TCPSocket:");
    match &handler.tcp_socket {
        Some(tcp) => {
            let port = match &tcp.port {
                IntOrString::Int(n) => format!("{{0 {n} }}"),
                IntOrString::String(s) => format!("{{1 0 {s}}}"),
            };
            let _ = write!(out, "&TCPSocketAction{{Port:{port},Host:{},}}", tcp.host.as_deref().unwrap_or_default());
        }
        None => out.push_str("nil"),
    }
    out.push_str(",Sleep:nil,}");
    out
}

#[cfg(test)]
mod tests;
