//! `/healthz`: named health checks rendered the way `k8s.io/apiserver/pkg/server/healthz`
//! renders them, served on the plain healthz port and (authenticated) on the API port.
//!
//! - all checks pass: 200 `ok` (with `?verbose`: one `[+]name ok` line per check, with a
//!   parenthesised note when the check has one, then `healthz check passed`);
//! - a check fails: 500 with every check listed (`[-]pleg failed: <reason>`), then
//!   `healthz check failed`;
//! - `/healthz/<name>` runs one check: 200 `ok` or 500 `internal server error: <reason>`.
//!
//! Unlike upstream, a failed check's reason is shown rather than "reason withheld": the
//! checks' messages are written to be public (no secrets), and the DESIGN asks that, for
//! example, the PLEG's fallback to relisting be visible in `/healthz`.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One named health check. Its failure message is shown to every client of `/healthz`
/// (unauthenticated on the healthz port): never put secrets in it.
pub trait HealthCheck: Send + Sync {
    /// The name in `[+]name ok`; also the path of `/healthz/<name>`.
    fn name(&self) -> &str;
    /// `Ok` when healthy, else why not.
    fn check(&self) -> Result<(), String>;
    /// A note shown after `ok` in the verbose listing (`[+]pleg ok (relisting only: ...)`),
    /// for states that are healthy but worth knowing, such as a fallback. Default: none.
    fn detail(&self) -> Option<String> {
        None
    }
}

/// The always-passing `ping` check every healthz endpoint starts with.
#[derive(Debug, Clone, Copy, Default)]
pub struct PingCheck;

impl HealthCheck for PingCheck {
    fn name(&self) -> &'static str {
        "ping"
    }

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A check whose result the test sets: healthy until told otherwise.
#[derive(Debug)]
pub struct FakeHealthCheck {
    name: String,
    result: Mutex<Result<(), String>>,
}

impl FakeHealthCheck {
    /// A healthy check called `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), result: Mutex::new(Ok(())) }
    }

    /// Makes the check pass.
    pub fn set_healthy(&self) {
        *self.result.lock().expect("fake health check lock") = Ok(());
    }

    /// Makes the check fail with `reason`.
    pub fn set_failing(&self, reason: impl Into<String>) {
        *self.result.lock().expect("fake health check lock") = Err(reason.into());
    }
}

impl HealthCheck for FakeHealthCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self) -> Result<(), String> {
        self.result.lock().expect("fake health check lock").clone()
    }
}

/// The checks behind one `/healthz` (`ping` first, then the registered ones in order).
#[derive(Clone)]
pub(crate) struct Healthz {
    checks: Arc<[Arc<dyn HealthCheck>]>,
}

impl std::fmt::Debug for Healthz {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.checks.iter().map(|c| c.name()).collect();
        f.debug_struct("Healthz").field("checks", &names).finish()
    }
}

impl Healthz {
    pub(crate) fn new(checks: &[Arc<dyn HealthCheck>]) -> Self {
        let ping: Arc<dyn HealthCheck> = Arc::new(PingCheck);
        Self { checks: std::iter::once(ping).chain(checks.iter().cloned()).collect() }
    }

    /// `/healthz` and `/healthz/{name}`.
    pub(crate) fn router(&self) -> Router {
        Router::new()
            .route("/healthz", get(all_checks))
            .route("/healthz/{name}", get(one_check))
            .with_state(self.clone())
    }
}

async fn all_checks(State(healthz): State<Healthz>, RawQuery(query): RawQuery) -> Response {
    let verbose = query.as_deref().is_some_and(|q| q.split('&').any(|kv| kv.split('=').next() == Some("verbose")));
    let mut lines = String::new();
    let mut failed = Vec::new();
    for check in healthz.checks.iter() {
        match check.check() {
            Ok(()) => match check.detail() {
                Some(detail) => {
                    let _ = writeln!(lines, "[+]{} ok ({detail})", check.name());
                }
                None => {
                    let _ = writeln!(lines, "[+]{} ok", check.name());
                }
            },
            Err(reason) => {
                let _ = writeln!(lines, "[-]{} failed: {reason}", check.name());
                failed.push(check.name().to_owned());
            }
        }
    }
    if !failed.is_empty() {
        tracing::info!(failed = %failed.join(","), "healthz check failed");
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{lines}healthz check failed\n"));
    }
    if verbose {
        text(StatusCode::OK, format!("{lines}healthz check passed\n"))
    } else {
        text(StatusCode::OK, "ok".to_owned())
    }
}

async fn one_check(State(healthz): State<Healthz>, Path(name): Path<String>) -> Response {
    let Some(check) = healthz.checks.iter().find(|c| c.name() == name) else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned());
    };
    match check.check() {
        Ok(()) => text(StatusCode::OK, "ok".to_owned()),
        Err(reason) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {reason}\n")),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")], body)
        .into_response()
}
