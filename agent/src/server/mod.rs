//! The kubelet's HTTP endpoints: the authenticated HTTPS API on `address:port` (10250), the
//! unauthenticated read-only API on `address:readOnlyPort` (off by default), and the
//! plain-HTTP `/healthz` on `healthzBindAddress:healthzPort` (10248).
//!
//! HTTPS routes: `/pods` (a `PodList` from a [`PodsProvider`]), `/metrics` (from a
//! `prometheus_client` registry; see below), `/healthz` (see [`HealthCheck`]),
//! `/configz`, the debugging handlers and `/logs/` (see below, with
//! [`Endpoints::debugging_handlers`]), plus whatever later modules add through
//! [`Endpoints::route`]; everything else is 404. Every HTTPS request passes authentication and authorization first (see the
//! `auth` module docs), unknown paths included, as upstream.
//!
//! # Authentication and authorization
//! - x509 client certificates against `authentication.x509.clientCAFile` (re-read when it
//!   changes; see `tls`), bearer tokens through `TokenReview`
//!   (`authentication.webhook.enabled`, cached for `cacheTTL`), anonymous requests only with
//!   `authentication.anonymous.enabled` (the `auth` module).
//! - `authorization.mode: Webhook` asks `SubjectAccessReview` for `nodes/<subresource>`
//!   (cached for `cacheAuthorizedTTL` / `cacheUnauthorizedTTL`), with upstream's
//!   fine-grained subresources and their fallback to `proxy`; `AlwaysAllow` allows every
//!   authenticated request (`auth`, `webhook`, `cache`).
//! - The webhooks need the agent's API client ([`Endpoints::api_client`]). Without one
//!   (standalone, no `--kubeconfig`) [`Server::new`] refuses them as upstream does ("no
//!   client provided, cannot use webhook authentication"), naming the settings to change.
//!   Both are the v1beta1 defaults, so a standalone agent must set
//!   `authentication.webhook.enabled: false` and `authorization.mode: AlwaysAllow`.
//!
//! # Debugging handlers and streaming
//! With `enableDebuggingHandlers` (default true; off, the paths answer 405 "Debug
//! endpoints are disabled." as upstream):
//! - `/exec/{ns}/{pod}[/{uid}]/{container}` and `/attach/...` (GET or POST; `command`,
//!   `stdin`, `stdout`, `stderr`, `tty` = `1`), `/portForward/{ns}/{pod}[/{uid}]` (WebSocket
//!   clients add `port`): the runtime's streaming URL (CRI `Exec`, `Attach`,
//!   `PortForward`) and the client's upgrade proxied to it and spliced, with
//!   `streamingConnectionIdleTimeout` — the protocols are the runtime's: SPDY/3.1 and
//!   WebSocket `v5.channel.k8s.io` / `v4.channel.k8s.io` (see `streaming` for the
//!   details, errors and deviations);
//! - `POST /run/{ns}/{pod}[/{uid}]/{container}?cmd=...`: `ExecSync`, stdout then stderr;
//! - `/containerLogs/{ns}/{pod}/{container}`: the CRI log file with upstream's options,
//!   streamed (see `container_logs` and [`crate::logs::reader`]);
//! - `/runningpods/`: the pods the runtime runs (ready sandboxes, running containers), as a
//!   `PodList` with only names, UIDs and container names and images (`running_pods`);
//! - `/logs/` with `enableSystemLogHandler` (default true; else 405 "logs endpoint is
//!   disabled."): `/var/log` as a file server that cannot leave it (`system_logs`).
//!
//! # The read-only port
//! With `readOnlyPort` set, plain HTTP on `address:readOnlyPort` without authentication or
//! authorization, serving what upstream's read-only server serves (`NewServer` with no auth
//! and no debugging handlers): `/healthz`, `/pods`, `/stats/...` and `/metrics`,
//! `/metrics/cadvisor`, `/metrics/resource`, `/metrics/probes`. The debugging paths
//! (`/run`, `/exec`, `/attach`, `/portForward`, `/containerLogs`, `/runningpods`,
//! `/debug/pprof`, `/logs`) answer 405 "Debug endpoints are disabled.", everything else
//! (`/configz` included) 404. Requests count in `kubelet_http_*` with `server_type`
//! `readonly`.
//!
//! # Limits
//! Both API listeners (not the loopback healthz one):
//! - request heads (request line and headers) over [`MAX_HEADER_BYTES`] get 431 (HTTP/1;
//!   HTTP/2 the same limit on the header list). Upstream allows 1 MiB; a kubelet's clients
//!   send a bearer token at most, so 32 KiB leaves room for large OIDC tokens while keeping
//!   a flood of huge heads cheap;
//! - a client must send a request's head within [`HEADER_READ_TIMEOUT`] (30 s) and finish
//!   the TLS handshake within 10 s, or the connection is closed (upstream: a 4 h read
//!   timeout). Slow clients hold only their own connection;
//! - requests other than the streaming and long-running ones (`/exec`, `/attach`,
//!   `/portForward`, `/containerLogs`, `/logs`, `/run`, `/debug`, `/checkpoint`) must be
//!   answered within [`REQUEST_TIMEOUT`] (60 s, webhook reviews included), else 504 with a
//!   `Timeout` Status, as the API server answers non-long-running requests; upstream has no
//!   such limit;
//! - paths with `.` or `..` segments (also percent-encoded) are 400 before authentication:
//!   the mapping of paths to subresources must never see one path and route another
//!   (upstream's Go mux redirects them to the cleaned path, also before authentication).
//!
//! # Metrics formats
//! Every metrics endpoint negotiates as the Go client (`expfmt.NegotiateIncludingOpenMetrics`):
//! the `Accept` ranges are tried by falling `q`; the first that is `text/plain` (version
//! 0.0.4 or none) gets Prometheus text 0.0.4, the first that is
//! `application/openmetrics-text` (version 1.0.0, 0.0.1 or none) gets `OpenMetrics` text,
//! ending in `# EOF`, with that version in its content type; anything else, or no
//! `Accept`, gets Prometheus text 0.0.4 (what Prometheus asks for and the kubelet serves).
//! Upstream's kubelet never serves `OpenMetrics`; here it is what a scraper gets when it
//! asks first for it (Prometheus does by default), and where exemplars will show.
//! Protobuf is not offered. The body is gzip-compressed when `Accept-Encoding` allows
//! `gzip` (as promhttp), at the fastest level: metrics text compresses about tenfold even
//! so, and the scrape's CPU is what the agent economizes.
//!
//! # Deliberate differences from the upstream kubelet
//! - `/healthz` shows why a check failed (upstream: "reason withheld"); see `healthz`.
//! - 401/403/500 bodies are `v1` `Status` JSON (upstream: the same words as plain text).
//! - A bearer token without webhook authentication is a 401 (upstream: anonymous).
//! - HEAD requests are authorized with the empty verb, as upstream, but then served (axum
//!   answers HEAD on GET routes; upstream's routes are GET only).
//! - The limits above (upstream: 1 MiB heads, 4 h timeouts, no per-request timeout).
//! - The self-signed certificate is ECDSA P-256 and self-signed (upstream: RSA 2048 signed
//!   by a throwaway CA written next to it); an existing one is reused only while it is
//!   valid, covers the node name and matches its key (upstream: whenever it exists).
//! - Webhook reviews time out after 10 s for authorization too (upstream: authentication
//!   only) and retry 503 too.
//! - Streaming: a container or pod not running in the runtime is 404 (upstream 500);
//!   credentials are not passed to the runtime's streaming server; `http://` streaming
//!   URLs only. `/containerLogs` reads the rest of a rotated file before the new one
//!   (upstream may drop it) and not the docker JSON format. `/logs/` refuses symlinks
//!   leading out of `/var/log`.

mod auth;
mod cache;
mod container_logs;
mod healthz;
pub mod metrics;
mod metrics_format;
mod pods;
mod running_pods;
mod serve_content;
mod streaming;
mod system_logs;
pub(crate) mod tls;
mod webhook;
mod x509_v1;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use axum::{Json, Router, middleware};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub use auth::{
    AlwaysAllow, Authorizer, Decision, FakeAuthorizer, FakeTokenAuthenticator, RequestAttributes, ReviewError,
    TokenAuthenticator, UserInfo,
};
pub use cache::{CACHE_CAPACITY, CachedAuthorizer, CachedTokenAuthenticator};
pub use healthz::{FakeHealthCheck, HealthCheck, PingCheck};
pub use pods::{FakePods, PodsProvider};
pub use system_logs::SYSTEM_LOG_DIR;
pub use tls::{SELF_SIGNED_CERT_FILE, SELF_SIGNED_KEY_FILE, ServingSlot, TlsSettings};
pub use webhook::{REVIEW_TIMEOUT, SubjectAccessReviewAuthorizer, TokenReviewAuthenticator};

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Settings the server cannot serve as they are; each line names what to change.
    #[error("server settings that cannot be served:\n  {}", problems.join("\n  "))]
    Settings {
        /// One problem per line.
        problems: Vec<String>,
    },
    /// An address or port setting is unusable (validated configurations never have one;
    /// this guards other callers).
    #[error("{field}: {message}")]
    InvalidSetting {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A listener could not be bound.
    #[error("binding the {endpoint} to {addr}: {source}")]
    Bind {
        /// `HTTPS API`, `read-only API` or `healthz endpoint`.
        endpoint: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// TLS material is unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// Reading or writing certificate files failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A listener failed while serving.
    #[error("serving the {endpoint} on {addr}: {source}")]
    Serve {
        /// `HTTPS API`, `read-only API` or `healthz endpoint`.
        endpoint: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

const HTTPS_API: &str = "HTTPS API";
const READ_ONLY_API: &str = "read-only API";
const HEALTHZ: &str = "healthz endpoint";

pub use crate::types::authorization::{AUTHORIZATION_MODE_ALWAYS_ALLOW, AUTHORIZATION_MODE_WEBHOOK};

/// Largest request head (request line and headers) the API listeners read.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
/// Time a client has to send a request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a non-streaming request has to be answered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_mins(1);

/// Limits of the API listeners (see the module docs). Default: the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request head; at least 8 KiB (hyper's minimum). Default: [`MAX_HEADER_BYTES`].
    pub max_header_bytes: usize,
    /// Default: [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// Default: [`REQUEST_TIMEOUT`].
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_header_bytes: MAX_HEADER_BYTES,
            header_read_timeout: HEADER_READ_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}

/// What the server needs from the configuration. Built by `settings::server` from the
/// `KubeletConfiguration`; the fields are public so tests (and embedders) can bind
/// elsewhere, e.g. to port 0.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// `address:port`; `None` when `enableServer` is false.
    pub https_addr: Option<SocketAddr>,
    /// `address:readOnlyPort`; `None` when `readOnlyPort` is 0 (the default).
    pub read_only_addr: Option<SocketAddr>,
    /// `healthzBindAddress:healthzPort`; `None` when `healthzPort` is 0.
    pub healthz_addr: Option<SocketAddr>,
    /// Certificates and client verification.
    pub tls: TlsSettings,
    /// The node name (authorization attributes).
    pub node_name: String,
    /// `authentication.anonymous.enabled`.
    pub anonymous_auth: bool,
    /// `authentication.webhook.enabled`: bearer tokens checked with `TokenReview`.
    pub webhook_authentication: bool,
    /// `authentication.webhook.cacheTTL`.
    pub token_cache_ttl: Duration,
    /// `authorization.mode`: [`AUTHORIZATION_MODE_ALWAYS_ALLOW`] or
    /// [`AUTHORIZATION_MODE_WEBHOOK`]; anything else is refused by [`Server::new`].
    pub authorization_mode: String,
    /// `authorization.webhook.cacheAuthorizedTTL`.
    pub authorized_ttl: Duration,
    /// `authorization.webhook.cacheUnauthorizedTTL`.
    pub unauthorized_ttl: Duration,
    /// The `/configz` document.
    pub configz: serde_json::Value,
    /// Limits of the API listeners.
    pub limits: Limits,
    /// How long open requests may finish after shutdown is asked. Default: 5s.
    pub shutdown_grace_period: Duration,
}

/// What the HTTPS API serves: the providers of the built-in routes and the routes of later
/// modules (a router builder), and what authentication and authorization need.
pub struct Endpoints {
    pods: Arc<dyn PodsProvider>,
    metrics: Vec<(String, Arc<Registry>)>,
    health_checks: Vec<Arc<dyn HealthCheck>>,
    authorizer: Option<Arc<dyn Authorizer>>,
    token_authenticator: Option<Arc<dyn TokenAuthenticator>>,
    api_client: Option<kube::Client>,
    routes: Router,
    http_metrics: Option<Arc<metrics::HttpMetrics>>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let metrics: Vec<&str> = self.metrics.iter().map(|(path, _)| path.as_str()).collect();
        let checks: Vec<&str> = self.health_checks.iter().map(|c| c.name()).collect();
        f.debug_struct("Endpoints")
            .field("metrics", &metrics)
            .field("health_checks", &checks)
            .field("api_client", &self.api_client.is_some())
            .finish_non_exhaustive()
    }
}

impl Endpoints {
    /// `/pods` from `pods` and `/metrics` from `metrics`.
    #[must_use]
    pub fn new(pods: Arc<dyn PodsProvider>, metrics: Arc<Registry>) -> Self {
        Self {
            pods,
            metrics: vec![("/metrics".to_owned(), metrics)],
            health_checks: Vec::new(),
            authorizer: None,
            token_authenticator: None,
            api_client: None,
            routes: Router::new(),
            http_metrics: None,
        }
    }

    /// Counts every request to the API listeners in `kubelet_http_*` of `metrics`.
    #[must_use]
    pub fn http_metrics(mut self, metrics: Arc<metrics::HttpMetrics>) -> Self {
        self.http_metrics = Some(metrics);
        self
    }

    /// Adds a check to both `/healthz` endpoints (after the built-in `ping`).
    #[must_use]
    pub fn health_check(mut self, check: Arc<dyn HealthCheck>) -> Self {
        self.health_checks.push(check);
        self
    }

    /// Serves another registry at `path` (`/metrics/probes`, `/metrics/resource`, ...).
    #[must_use]
    pub fn metrics_endpoint(mut self, path: &str, registry: Arc<Registry>) -> Self {
        self.metrics.push((path.to_owned(), registry));
        self
    }

    /// Adds an authenticated route (`/stats/summary`, `/containerLogs/...`, ...). The
    /// handler finds the caller's [`UserInfo`] in the request extensions. (On the read-only
    /// port the route is served, without a user, when its path is one upstream serves there.)
    #[must_use]
    pub fn route(mut self, path: &str, method_router: MethodRouter) -> Self {
        self.routes = self.routes.route(path, method_router);
        self
    }

    /// Serves the debugging handlers (`/exec`, `/attach`, `/portForward`, `/run`,
    /// `/containerLogs`, `/runningpods/`) and `/logs/` as `handlers` says (see the module docs); without
    /// this call those paths are 404.
    #[must_use]
    pub fn debugging_handlers(mut self, handlers: DebuggingHandlers) -> Self {
        use axum::routing::post;
        if !handlers.enable_debugging_handlers {
            for root in ["run", "exec", "attach", "portForward", "containerLogs", "logs"] {
                self.routes = self.routes.route(&format!("/{root}/{{*rest}}"), axum::routing::any(debugging_disabled));
            }
            for path in ["/runningpods", "/runningpods/"] {
                self.routes = self.routes.route(path, axum::routing::any(debugging_disabled));
            }
            return self;
        }
        let stream_state = streaming::StreamingState {
            pods: self.pods.clone(),
            runtime: handlers.runtime.clone(),
            idle_timeout: handlers.streaming_connection_idle_timeout,
        };
        let exec = get(streaming::exec).post(streaming::exec).with_state(stream_state.clone());
        let attach = get(streaming::attach).post(streaming::attach).with_state(stream_state.clone());
        let port_forward = get(streaming::port_forward).post(streaming::port_forward).with_state(stream_state.clone());
        let run = post(streaming::run).with_state(stream_state);
        let running_pods = get(running_pods::list_running_pods).with_state(handlers.runtime.clone());
        let logs_state = container_logs::LogsState { pods: self.pods.clone(), runtime: handlers.runtime };
        self.routes = self
            .routes
            .route("/exec/{ns}/{pod}/{container}", exec.clone())
            .route("/exec/{ns}/{pod}/{uid}/{container}", exec)
            .route("/attach/{ns}/{pod}/{container}", attach.clone())
            .route("/attach/{ns}/{pod}/{uid}/{container}", attach)
            .route("/portForward/{ns}/{pod}", port_forward.clone())
            .route("/portForward/{ns}/{pod}/{uid}", port_forward)
            .route("/run/{ns}/{pod}/{container}", run.clone())
            .route("/run/{ns}/{pod}/{uid}/{container}", run)
            .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs::container_logs).with_state(logs_state))
            .route("/runningpods/", running_pods.clone())
            .route("/runningpods", running_pods);
        self.routes = if handlers.enable_system_log_handler {
            let logs = system_logs::SystemLogs { root: Arc::new(handlers.system_log_dir) };
            self.routes
                .route("/logs/", get(system_logs::root).with_state(logs.clone()))
                .route("/logs/{*path}", get(system_logs::path).with_state(logs))
        } else {
            self.routes.route("/logs/", get(system_logs::disabled)).route("/logs/{*path}", get(system_logs::disabled))
        };
        self
    }

    /// The API server client that webhook authentication (`TokenReview`) and authorization
    /// (`SubjectAccessReview`) ask; without one, those settings are refused.
    #[must_use]
    pub fn api_client(mut self, client: kube::Client) -> Self {
        self.api_client = Some(client);
        self
    }

    /// Uses `authorizer` instead of the one `authorization.mode` selects.
    #[must_use]
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }

    /// Checks bearer tokens with `authenticator` (as given: no cache is added), whatever
    /// `authentication.webhook.enabled` says.
    #[must_use]
    pub fn token_authenticator(mut self, authenticator: Arc<dyn TokenAuthenticator>) -> Self {
        self.token_authenticator = Some(authenticator);
        self
    }
}

/// What the debugging handlers need and the settings that turn them on (built by
/// `settings::debugging_handlers` from the `KubeletConfiguration`).
#[derive(Clone)]
pub struct DebuggingHandlers {
    /// The runtime: streaming URLs, `ExecSync`, container statuses.
    pub runtime: Arc<dyn crate::container::RuntimeService>,
    /// `enableDebuggingHandlers` (default true): off, the paths answer 405.
    pub enable_debugging_handlers: bool,
    /// `enableSystemLogHandler` (default true): `/logs/`.
    pub enable_system_log_handler: bool,
    /// `streamingConnectionIdleTimeout` (default 4h).
    pub streaming_connection_idle_timeout: Duration,
    /// What `/logs/` serves. Default: [`SYSTEM_LOG_DIR`].
    pub system_log_dir: PathBuf,
}

impl std::fmt::Debug for DebuggingHandlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebuggingHandlers")
            .field("enable_debugging_handlers", &self.enable_debugging_handlers)
            .field("enable_system_log_handler", &self.enable_system_log_handler)
            .field("streaming_connection_idle_timeout", &self.streaming_connection_idle_timeout)
            .field("system_log_dir", &self.system_log_dir)
            .finish_non_exhaustive()
    }
}

/// The debugging paths with `enableDebuggingHandlers: false` (upstream
/// `InstallDebuggingDisabledHandlers`).
async fn debugging_disabled() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "Debug endpoints are disabled.\n",
    )
        .into_response()
}

/// The listeners, bound and ready to serve.
#[derive(Debug)]
pub struct Server {
    https: Option<HttpsListener>,
    read_only: Option<(std::net::TcpListener, Router)>,
    healthz: Option<(std::net::TcpListener, Router)>,
    limits: Limits,
    shutdown_grace_period: Duration,
}

#[derive(Debug)]
struct HttpsListener {
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
}

impl Server {
    /// Checks the settings, prepares TLS (writing a self-signed certificate if needed) and
    /// binds the listeners.
    pub fn new(settings: ServerSettings, endpoints: Endpoints) -> Result<Self> {
        let (tokens, authorizer) = authentication_and_authorization(&settings, &endpoints)?;
        let ServerSettings {
            https_addr,
            read_only_addr,
            healthz_addr,
            tls: tls_settings,
            node_name,
            anonymous_auth,
            configz,
            limits,
            shutdown_grace_period,
            ..
        } = settings;
        let healthz = healthz::Healthz::new(&endpoints.health_checks);
        let http_metrics = endpoints.http_metrics.clone();
        let base = https_router(configz, endpoints, &healthz);
        let guard = Arc::new(limits);
        let https = match https_addr {
            None => None,
            Some(addr) => {
                let tls = tls::server_config(&tls_settings)?;
                let auth = auth::AuthState {
                    client_ca: tls.client_ca,
                    tokens,
                    anonymous: anonymous_auth,
                    node_name,
                    authorizer,
                };
                let mut router = base
                    .clone()
                    .layer(middleware::from_fn_with_state(auth, auth::filter))
                    .layer(middleware::from_fn_with_state(guard.clone(), guard_request));
                // Outermost, as upstream counts in ServeHTTP before any filter.
                if let Some(m) = &http_metrics {
                    router = router.layer(middleware::from_fn_with_state((m.clone(), "readwrite"), count_requests));
                }
                Some(HttpsListener { listener: bind(HTTPS_API, addr)?, tls: Arc::new(tls.config), router })
            }
        };
        let read_only = match read_only_addr {
            None => None,
            Some(addr) => {
                let mut router = base
                    .layer(middleware::from_fn(read_only_paths))
                    .layer(middleware::from_fn_with_state(guard, guard_request));
                if let Some(m) = &http_metrics {
                    router = router.layer(middleware::from_fn_with_state((m.clone(), "readonly"), count_requests));
                }
                Some((bind(READ_ONLY_API, addr)?, router))
            }
        };
        let healthz = match healthz_addr {
            None => None,
            Some(addr) => Some((bind(HEALTHZ, addr)?, healthz.router().fallback(not_found))),
        };
        Ok(Self { https, read_only, healthz, limits, shutdown_grace_period })
    }

    /// The bound address of the HTTPS API (the real port when 0 was asked).
    #[must_use]
    pub fn https_addr(&self) -> Option<SocketAddr> {
        self.https.as_ref().and_then(|h| h.listener.local_addr().ok())
    }

    /// The bound address of the read-only API.
    #[must_use]
    pub fn read_only_addr(&self) -> Option<SocketAddr> {
        self.read_only.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The bound address of the healthz endpoint.
    #[must_use]
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The routers of the HTTPS API, the read-only API and healthz, with every filter they
    /// serve through (request guard, authentication and authorization, read-only paths,
    /// request counting); the listeners are closed. For sending requests in process
    /// (`tower::ServiceExt::oneshot`), as the fuzz targets in `fuzz/` do: no sockets, no
    /// TLS, so a request authenticates by bearer token or as anonymous.
    #[must_use]
    pub fn into_routers(self) -> Routers {
        Routers {
            https: self.https.map(|h| h.router),
            read_only: self.read_only.map(|(_, router)| router),
            healthz: self.healthz.map(|(_, router)| router),
        }
    }

    /// Serves until `shutdown` is cancelled, then lets open requests finish for the grace
    /// period. Returns early with the error if a listener fails.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let Self { https, read_only, healthz, limits, shutdown_grace_period: grace } = self;
        let https = async {
            let Some(HttpsListener { listener, tls, router }) = https else {
                return Ok(());
            };
            let addr = local_addr(&listener, HTTPS_API)?;
            let serve_error = |source| Error::Serve { endpoint: HTTPS_API, addr, source };
            let handle = axum_server::Handle::new();
            let config = axum_server::tls_rustls::RustlsConfig::from_config(tls);
            // A refused handshake (a bad client certificate, a protocol mismatch) says why.
            let mut server = axum_server::from_tcp_rustls(listener, config)
                .map_err(serve_error)?
                .handle(handle.clone())
                .accept_error_handler(|peer, error| {
                    tracing::warn!(peer = ?peer, %error, "TLS handshake failed");
                });
            apply_limits(&mut server, &limits);
            tracing::info!(%addr, "serving the HTTPS API");
            serve_until(server.serve(router.into_make_service()), &handle, &shutdown, grace).await.map_err(serve_error)
        };
        let read_only = async {
            let Some((listener, router)) = read_only else {
                return Ok(());
            };
            let addr = local_addr(&listener, READ_ONLY_API)?;
            let serve_error = |source| Error::Serve { endpoint: READ_ONLY_API, addr, source };
            let handle = axum_server::Handle::new();
            let mut server = axum_server::from_tcp(listener).map_err(serve_error)?.handle(handle.clone());
            apply_limits(&mut server, &limits);
            tracing::warn!(%addr, "serving the read-only API without authentication (readOnlyPort)");
            serve_until(server.serve(router.into_make_service()), &handle, &shutdown, grace).await.map_err(serve_error)
        };
        let healthz = async {
            let Some((listener, router)) = healthz else {
                return Ok(());
            };
            let addr = local_addr(&listener, HEALTHZ)?;
            let serve_error = |source| Error::Serve { endpoint: HEALTHZ, addr, source };
            let listener = tokio::net::TcpListener::from_std(listener).map_err(serve_error)?;
            tracing::info!(%addr, "serving healthz");
            let serve = axum::serve(listener, router).with_graceful_shutdown(shutdown.clone().cancelled_owned());
            tokio::select! {
                result = serve => result.map_err(serve_error),
                () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => Ok(()),
            }
        };
        tokio::try_join!(https, read_only, healthz).map(|_| ())
    }
}

/// The routers of a [`Server`] without their listeners ([`Server::into_routers`]).
#[derive(Debug)]
pub struct Routers {
    /// The HTTPS API, when `https_addr` was set.
    pub https: Option<Router>,
    /// The read-only API, when `read_only_addr` was set.
    pub read_only: Option<Router>,
    /// healthz, when `healthz_addr` was set.
    pub healthz: Option<Router>,
}

/// Runs `serve` until `shutdown`, then asks `handle` for a graceful stop and leaves
/// `serve` to drain (bounded by `grace`).
async fn serve_until(
    serve: impl Future<Output = io::Result<()>>,
    handle: &axum_server::Handle<SocketAddr>,
    shutdown: &CancellationToken,
    grace: Duration,
) -> io::Result<()> {
    let stop = async {
        shutdown.cancelled().await;
        handle.graceful_shutdown(Some(grace));
        std::future::pending::<()>().await;
    };
    tokio::select! {
        result = serve => result,
        () = stop => unreachable!("stop never completes"),
    }
}

/// Head size and read timeouts of an API listener (see the module docs).
fn apply_limits<Acceptor>(server: &mut axum_server::Server<SocketAddr, Acceptor>, limits: &Limits) {
    let builder = server.http_builder();
    builder.http1().max_buf_size(limits.max_header_bytes.max(8 * 1024)).header_read_timeout(limits.header_read_timeout);
    builder.http2().max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
}

/// The token authenticator (if tokens are accepted) and the authorizer.
type AuthParts = (Option<Arc<dyn TokenAuthenticator>>, Arc<dyn Authorizer>);

/// The token authenticator and the authorizer for these settings, or every reason they
/// cannot be served.
fn authentication_and_authorization(settings: &ServerSettings, endpoints: &Endpoints) -> Result<AuthParts> {
    let mut problems = Vec::new();
    let tokens: Option<Arc<dyn TokenAuthenticator>> =
        match (&endpoints.token_authenticator, &endpoints.api_client, settings.webhook_authentication) {
            (Some(tokens), _, _) => Some(tokens.clone()),
            (None, _, false) => None,
            (None, Some(client), true) => Some(Arc::new(CachedTokenAuthenticator::new(
                Arc::new(TokenReviewAuthenticator::new(client.clone())),
                settings.token_cache_ttl,
            ))),
            (None, None, true) => {
                problems.push(
                    "authentication.webhook.enabled: no client provided, cannot use webhook authentication \
                     (bearer tokens are checked with a TokenReview, which needs --kubeconfig); it is on by \
                     default in kubelet.config.k8s.io/v1beta1, so a standalone agent must set \
                     authentication.webhook.enabled: false and authenticate clients with \
                     authentication.x509.clientCAFile (--client-ca-file)"
                        .to_owned(),
                );
                None
            }
        };
    let authorizer: Option<Arc<dyn Authorizer>> =
        match (&endpoints.authorizer, settings.authorization_mode.as_str(), &endpoints.api_client) {
            (Some(authorizer), _, _) => Some(authorizer.clone()),
            (None, AUTHORIZATION_MODE_ALWAYS_ALLOW, _) => Some(Arc::new(AlwaysAllow)),
            (None, AUTHORIZATION_MODE_WEBHOOK, Some(client)) => Some(Arc::new(CachedAuthorizer::new(
                Arc::new(SubjectAccessReviewAuthorizer::new(client.clone())),
                settings.authorized_ttl,
                settings.unauthorized_ttl,
            ))),
            (None, AUTHORIZATION_MODE_WEBHOOK, None) => {
                problems.push(
                    "authorization.mode: Webhook (the v1beta1 default): no client provided, cannot use \
                     webhook authorization (decisions are asked with a SubjectAccessReview, which needs \
                     --kubeconfig); a standalone agent must set authorization.mode: AlwaysAllow \
                     (--authorization-mode=AlwaysAllow). AlwaysAllow lets every authenticated client use \
                     the whole API, so limit who authenticates: authentication.x509.clientCAFile and \
                     authentication.anonymous.enabled: false"
                        .to_owned(),
                );
                None
            }
            (None, other, _) => {
                problems.push(format!(
                    "authorization.mode: unsupported value {other:?}, must be one of [\"AlwaysAllow\", \"Webhook\"]"
                ));
                None
            }
        };
    match authorizer {
        Some(authorizer) if problems.is_empty() => Ok((tokens, authorizer)),
        _ => Err(Error::Settings { problems }),
    }
}

/// Paths served on the read-only port (upstream's default handlers).
const READ_ONLY_PATHS: [&str; 4] = ["/healthz", "/pods", "/stats", "/metrics"];
/// Paths the read-only port refuses with 405 (upstream `InstallDebuggingDisabledHandlers`).
const DEBUG_PATHS: [&str; 8] =
    ["/run", "/exec", "/attach", "/portForward", "/containerLogs", "/runningpods", "/debug/pprof", "/logs"];

/// The read-only port's filter (see the module docs).
async fn read_only_paths(request: axum::extract::Request, next: middleware::Next) -> Response {
    let path = request.uri().path();
    if READ_ONLY_PATHS.iter().any(|p| auth::is_subpath(path, p)) {
        return next.run(request).await;
    }
    if DEBUG_PATHS.iter().any(|p| auth::is_subpath(path, p)) {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "Debug endpoints are disabled.\n",
        )
            .into_response();
    }
    not_found().await
}

/// Path roots whose requests stream or may run long: no request timeout.
const LONG_RUNNING: [&str; 8] =
    ["exec", "attach", "portForward", "containerLogs", "logs", "run", "debug", "checkpoint"];

/// Whether a path has `.` or `..` segments, percent-encoded or not.
fn has_dot_segments(path: &str) -> bool {
    path.split('/').any(|segment| {
        let decoded = segment.replace("%2e", ".").replace("%2E", ".");
        decoded == "." || decoded == ".."
    })
}

/// The limits in front of authentication (see the module docs): bad paths, request timeout.
async fn guard_request(
    State(limits): State<Arc<Limits>>,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let path = request.uri().path();
    if has_dot_segments(path) {
        return auth::status(StatusCode::BAD_REQUEST, "BadRequest", "invalid path: dot segments are not allowed");
    }
    let root = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    if LONG_RUNNING.contains(&root) {
        return next.run(request).await;
    }
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => auth::status(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!("Timeout: request did not complete within {:?}", limits.request_timeout),
        ),
    }
}

fn https_router(configz: serde_json::Value, endpoints: Endpoints, healthz: &healthz::Healthz) -> Router {
    let mut router = Router::new()
        .route("/pods", get(pods::list_pods).with_state(endpoints.pods))
        .route("/configz", get(serve_configz).with_state(Arc::new(configz)))
        .merge(healthz.router());
    for (path, registry) in endpoints.metrics {
        router = router.route(&path, get(metrics).with_state(registry));
    }
    router.merge(endpoints.routes).fallback(not_found)
}

/// Upstream `getURLRootPath`: `metrics/<x>` for metrics paths, else the first segment.
fn url_root_path(path: &str) -> String {
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let first = parts.next().unwrap_or_default();
    match (first, parts.next()) {
        ("metrics", Some(second)) => format!("metrics/{second}"),
        _ => first.to_string(),
    }
}

/// The `path` label: a path the server serves, else `other` (upstream
/// `getMetricBucket`, which keeps the label's values bounded).
fn metric_path_bucket(path: &str) -> String {
    const KNOWN: &[&str] = &[
        "pods",
        "runningpods",
        "stats",
        "metrics",
        "metrics/cadvisor",
        "metrics/probes",
        "metrics/resource",
        "healthz",
        "configz",
        "events",
        "logs",
        "containerLogs",
        "exec",
        "attach",
        "portForward",
        "run",
        "debug",
        "checkpoint",
        "spec",
    ];
    let root = url_root_path(path);
    if KNOWN.contains(&root.as_str()) { root } else { "other".into() }
}

/// Upstream `getMetricMethodBucket`: the standard methods, else `other`.
fn metric_method_bucket(method: &http::Method) -> String {
    const KNOWN: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"];
    if KNOWN.contains(&method.as_str()) { method.as_str().to_string() } else { "other".into() }
}

/// Takes a request out of the in-flight gauge however its handler ends (a client that
/// goes away drops the future).
struct InFlight(prometheus_client::metrics::gauge::Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `kubelet_http_requests_total`, `kubelet_http_inflight_requests` and
/// `kubelet_http_requests_duration_seconds` of every request (upstream `ServeHTTP`), with
/// `server_type` `readwrite` (HTTPS) or `readonly`.
async fn count_requests(
    State((metrics, server_type)): State<(Arc<metrics::HttpMetrics>, &'static str)>,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let path = metric_path_bucket(request.uri().path());
    let long_running = ["exec", "attach", "portforward", "debug"].contains(&path.as_str());
    let labels = metrics::HttpLabels {
        method: metric_method_bucket(request.method()),
        path,
        server_type: server_type.into(),
        long_running: long_running.to_string(),
    };
    metrics.http_requests.get_or_create(&labels).inc();
    let gauge = metrics.http_inflight_requests.get_or_create(&labels).clone();
    gauge.inc();
    let _in_flight = InFlight(gauge);
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    metrics.http_requests_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    response
}

async fn serve_configz(State(document): State<Arc<serde_json::Value>>) -> Response {
    Json(document.as_ref()).into_response()
}

/// A metrics endpoint: the registry in the negotiated format, gzipped when asked (see the
/// module docs).
async fn metrics(State(registry): State<Arc<Registry>>, headers: HeaderMap) -> Response {
    let text_header = |name| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let format = metrics_format::negotiate(text_header(&header::ACCEPT));
    let mut body = String::new();
    if let Err(error) = format.encode(&mut body, &registry) {
        tracing::error!(%error, "encoding metrics");
        return (StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed\n").into_response();
    }
    metrics_response(&headers, format.content_type(), body)
}

/// A metrics body as `content_type`, gzip-compressed when the request's `Accept-Encoding`
/// allows it (promhttp's behaviour, which every upstream metrics endpoint has).
pub(crate) fn metrics_response(headers: &HeaderMap, content_type: &'static str, body: String) -> Response {
    let accept_encoding = headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !metrics_format::accepts_gzip(accept_encoding) {
        return ([(header::CONTENT_TYPE, content_type)], body).into_response();
    }
    match metrics_format::gzip(body.as_bytes()) {
        Ok(compressed) => {
            ([(header::CONTENT_TYPE, content_type), (header::CONTENT_ENCODING, "gzip")], compressed).into_response()
        }
        Err(error) => {
            tracing::error!(%error, "compressing metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, "compressing metrics failed\n").into_response()
        }
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "404 page not found\n")
        .into_response()
}

fn bind(endpoint: &'static str, addr: SocketAddr) -> Result<std::net::TcpListener> {
    let bind_error = |source| Error::Bind { endpoint, addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    Ok(listener)
}

fn local_addr(listener: &std::net::TcpListener, endpoint: &'static str) -> Result<SocketAddr> {
    listener.local_addr().map_err(|source| Error::Io { what: format!("reading the address of the {endpoint}"), source })
}

#[cfg(test)]
mod tests;
