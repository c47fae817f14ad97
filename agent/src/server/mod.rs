//! The kubelet's HTTP endpoints: the authenticated HTTPS API on `address:port` (10250) and
//! the plain-HTTP `/healthz` on `healthzBindAddress:healthzPort` (10248).
//!
//! HTTPS routes: `/pods` (a `PodList` from a [`PodsProvider`]), `/metrics` (from a
//! `prometheus_client` registry; see below), `/healthz` (see [`HealthCheck`]),
//! `/configz`, plus whatever later modules add through [`Endpoints::route`]; everything else
//! is 404. Every HTTPS request passes authentication and authorization first (see the
//! `auth` module docs), unknown paths included, as upstream.
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
//! # Settings that are refused at start
//! Webhook authentication (`authentication.webhook.enabled`, bearer tokens checked with
//! `TokenReview`) and webhook authorization (`authorization.mode: Webhook`, decisions by
//! `SubjectAccessReview`) are not implemented yet. Both are the v1beta1 *defaults*, so a
//! config file that does not mention them asks for them; [`Server::new`] refuses them with
//! an error that names the settings to change, rather than serving with weaker checks than
//! the file asks for. The upstream kubelet refuses them too when it has no API client
//! (standalone mode, no `--kubeconfig`). `readOnlyPort` other than 0 is refused likewise.
//!
//! # Deliberate differences from the upstream kubelet
//! - `/healthz` shows why a check failed (upstream: "reason withheld"); see `healthz`.
//! - 401/403 bodies are `v1` `Status` JSON (upstream: the same words as plain text).
//! - A bearer token without webhook authentication is a 401 (upstream: anonymous).
//! - The self-signed certificate is ECDSA P-256 and self-signed (upstream: RSA 2048 signed
//!   by a throwaway CA written next to it); an existing one is reused only while it is
//!   valid, covers the node name and matches its key (upstream: whenever it exists).

mod auth;
mod healthz;
mod metrics_format;
mod pods;
mod tls;

use std::io;
use std::net::{IpAddr, SocketAddr};
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

pub use auth::{AlwaysAllow, Authorizer, Decision, FakeAuthorizer, RequestAttributes, UserInfo};
pub use healthz::{FakeHealthCheck, HealthCheck, PingCheck};
pub use pods::{FakePods, PodsProvider};
pub use tls::{SELF_SIGNED_CERT_FILE, SELF_SIGNED_KEY_FILE, TlsSettings};

use crate::config::{AUTHORIZATION_MODE_ALWAYS_ALLOW, AUTHORIZATION_MODE_WEBHOOK, Config};

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Settings the server does not implement; each line names what to change.
    #[error("unsupported server settings:\n  {}", problems.join("\n  "))]
    Unsupported {
        /// One problem per line.
        problems: Vec<String>,
    },
    /// An address or port setting is unusable (configs from [`crate::config::load`] are
    /// validated already; this guards other callers).
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
        /// `HTTPS API` or `healthz endpoint`.
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
        /// `HTTPS API` or `healthz endpoint`.
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
const HEALTHZ: &str = "healthz endpoint";

/// What the server needs from the configuration. Built with [`ServerSettings::from_config`];
/// the fields are public so tests (and embedders) can bind elsewhere, e.g. to port 0.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// `address:port`; `None` when `enableServer` is false.
    pub https_addr: Option<SocketAddr>,
    /// `healthzBindAddress:healthzPort`; `None` when `healthzPort` is 0.
    pub healthz_addr: Option<SocketAddr>,
    /// `readOnlyPort` (only 0 is supported).
    pub read_only_port: i32,
    /// Certificates and client verification.
    pub tls: TlsSettings,
    /// The node name (authorization attributes).
    pub node_name: String,
    /// `authentication.anonymous.enabled`.
    pub anonymous_auth: bool,
    /// `authentication.webhook.enabled` (refused when true).
    pub webhook_authentication: bool,
    /// `authorization.mode`.
    pub authorization_mode: String,
    /// The `/configz` document.
    pub configz: serde_json::Value,
    /// How long open requests may finish after shutdown is asked. Default: 5s.
    pub shutdown_grace_period: Duration,
}

impl ServerSettings {
    /// The settings of `config`.
    pub fn from_config(config: &Config) -> Result<Self> {
        let kc = &config.kubelet;
        let addr = |ip_field, ip: &str, port_field, port: i32| {
            let ip = ip.parse::<IpAddr>().map_err(|_| Error::InvalidSetting {
                field: ip_field,
                message: format!("{ip:?} is not a valid IP address"),
            })?;
            let port = u16::try_from(port).ok().filter(|&p| p != 0).ok_or_else(|| Error::InvalidSetting {
                field: port_field,
                message: format!("{port} must be between 1 and 65535, inclusive"),
            })?;
            Ok::<_, Error>(SocketAddr::new(ip, port))
        };
        let https_addr = if kc.enable_server { Some(addr("address", &kc.address, "port", kc.port)?) } else { None };
        let healthz_addr = if kc.healthz_port == 0 {
            None
        } else {
            Some(addr("healthzBindAddress", &kc.healthz_bind_address, "healthzPort", kc.healthz_port)?)
        };
        let mut names = vec![config.node_name.clone()];
        if let Ok(hostname) = crate::config::os_hostname().map(|h| h.to_lowercase())
            && !hostname.is_empty()
            && !names.contains(&hostname)
        {
            names.push(hostname);
        }
        let non_empty = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
        let cert_and_key = non_empty(&kc.tls_cert_file).zip(non_empty(&kc.tls_private_key_file));
        Ok(Self {
            https_addr,
            healthz_addr,
            read_only_port: kc.read_only_port,
            tls: TlsSettings {
                cert_and_key,
                cert_dir: config.cert_dir.clone(),
                names,
                client_ca_file: non_empty(&kc.authentication.x509.client_ca_file),
                cipher_suites: kc.tls_cipher_suites.clone(),
                min_version: kc.tls_min_version.clone(),
            },
            node_name: config.node_name.clone(),
            anonymous_auth: kc.authentication.anonymous.enabled,
            webhook_authentication: kc.authentication.webhook.enabled,
            authorization_mode: kc.authorization.mode.clone(),
            configz: kc.to_configz_json(),
            shutdown_grace_period: Duration::from_secs(5),
        })
    }
}

/// What the HTTPS API serves: the providers of the built-in routes and the routes of later
/// modules (a router builder).
pub struct Endpoints {
    pods: Arc<dyn PodsProvider>,
    metrics: Vec<(String, Arc<Registry>)>,
    health_checks: Vec<Arc<dyn HealthCheck>>,
    authorizer: Option<Arc<dyn Authorizer>>,
    routes: Router,
    http_metrics: Option<Arc<crate::metrics::KubeletMetrics>>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let metrics: Vec<&str> = self.metrics.iter().map(|(path, _)| path.as_str()).collect();
        let checks: Vec<&str> = self.health_checks.iter().map(|c| c.name()).collect();
        f.debug_struct("Endpoints").field("metrics", &metrics).field("health_checks", &checks).finish_non_exhaustive()
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
            routes: Router::new(),
            http_metrics: None,
        }
    }

    /// Counts every request to the HTTPS API in `kubelet_http_*` of `metrics`.
    #[must_use]
    pub fn http_metrics(mut self, metrics: Arc<crate::metrics::KubeletMetrics>) -> Self {
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
    /// handler finds the caller's [`UserInfo`] in the request extensions.
    #[must_use]
    pub fn route(mut self, path: &str, method_router: MethodRouter) -> Self {
        self.routes = self.routes.route(path, method_router);
        self
    }

    /// Uses `authorizer` instead of the one `authorization.mode` selects.
    #[must_use]
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }
}

/// Both listeners, bound and ready to serve.
#[derive(Debug)]
pub struct Server {
    https: Option<HttpsListener>,
    healthz: Option<(std::net::TcpListener, Router)>,
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
    /// binds both listeners.
    pub fn new(settings: ServerSettings, endpoints: Endpoints) -> Result<Self> {
        let authorizer = check_supported(&settings, endpoints.authorizer.clone())?;
        let ServerSettings {
            https_addr,
            healthz_addr,
            tls: tls_settings,
            node_name,
            anonymous_auth,
            configz,
            shutdown_grace_period,
            ..
        } = settings;
        let healthz = healthz::Healthz::new(&endpoints.health_checks);
        let https = match https_addr {
            None => None,
            Some(addr) => {
                let auth = auth::AuthState {
                    x509: tls_settings.client_ca_file.is_some(),
                    anonymous: anonymous_auth,
                    node_name,
                    authorizer,
                };
                let tls = Arc::new(tls::server_config(&tls_settings)?);
                let http_metrics = endpoints.http_metrics.clone();
                let mut router = https_router(configz, endpoints, &healthz)
                    .layer(middleware::from_fn_with_state(auth, auth::filter));
                // Outermost, as upstream counts in ServeHTTP before any filter.
                if let Some(m) = http_metrics {
                    router = router.layer(middleware::from_fn_with_state(m, count_requests));
                }
                Some(HttpsListener { listener: bind(HTTPS_API, addr)?, tls, router })
            }
        };
        let healthz = match healthz_addr {
            None => None,
            Some(addr) => Some((bind(HEALTHZ, addr)?, healthz.router().fallback(not_found))),
        };
        Ok(Self { https, healthz, shutdown_grace_period })
    }

    /// The bound address of the HTTPS API (the real port when 0 was asked).
    #[must_use]
    pub fn https_addr(&self) -> Option<SocketAddr> {
        self.https.as_ref().and_then(|h| h.listener.local_addr().ok())
    }

    /// The bound address of the healthz endpoint.
    #[must_use]
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves until `shutdown` is cancelled, then lets open requests finish for the grace
    /// period. Returns early with the error if a listener fails.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let Self { https, healthz, shutdown_grace_period: grace } = self;
        let https_shutdown = shutdown.clone();
        let https = async move {
            let Some(HttpsListener { listener, tls, router }) = https else {
                return Ok(());
            };
            let addr = local_addr(&listener, HTTPS_API)?;
            let serve_error = |source| Error::Serve { endpoint: HTTPS_API, addr, source };
            let handle = axum_server::Handle::new();
            let config = axum_server::tls_rustls::RustlsConfig::from_config(tls);
            let serve = axum_server::from_tcp_rustls(listener, config)
                .map_err(serve_error)?
                .handle(handle.clone())
                .serve(router.into_make_service());
            // Asks for the graceful stop, then leaves `serve` to drain (bounded by `grace`).
            let stop = async {
                https_shutdown.cancelled().await;
                handle.graceful_shutdown(Some(grace));
                std::future::pending::<()>().await;
            };
            tracing::info!(%addr, "serving the HTTPS API");
            tokio::select! {
                result = serve => result.map_err(serve_error),
                () = stop => unreachable!("stop never completes"),
            }
        };
        let healthz = async move {
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
        tokio::try_join!(https, healthz).map(|_| ())
    }
}

/// The authorizer for these settings, or every reason they cannot be served.
fn check_supported(settings: &ServerSettings, authorizer: Option<Arc<dyn Authorizer>>) -> Result<Arc<dyn Authorizer>> {
    let mut problems = Vec::new();
    if settings.webhook_authentication {
        problems.push(
            "authentication.webhook.enabled: bearer token (webhook) authentication is not \
             supported yet, and it is on by default in kubelet.config.k8s.io/v1beta1; set \
             authentication.webhook.enabled: false and authenticate clients with \
             authentication.x509.clientCAFile (--client-ca-file)"
                .to_owned(),
        );
    }
    let authorizer = match (settings.authorization_mode.as_str(), authorizer) {
        (_, Some(authorizer)) => Some(authorizer),
        (AUTHORIZATION_MODE_ALWAYS_ALLOW, None) => Some(Arc::new(AlwaysAllow) as Arc<dyn Authorizer>),
        (AUTHORIZATION_MODE_WEBHOOK, None) => {
            problems.push(
                "authorization.mode: Webhook (the v1beta1 default) is not supported yet; set \
                 authorization.mode: AlwaysAllow (or --authorization-mode=AlwaysAllow). \
                 AlwaysAllow lets every authenticated client use the whole API, so limit who \
                 authenticates: authentication.x509.clientCAFile and \
                 authentication.anonymous.enabled: false"
                    .to_owned(),
            );
            None
        }
        (other, None) => {
            problems.push(format!("authorization.mode: unsupported value {other:?}, must be \"AlwaysAllow\""));
            None
        }
    };
    if settings.read_only_port != 0 {
        problems.push(format!(
            "readOnlyPort: the unauthenticated read-only port is not supported; set \
             readOnlyPort: 0 (the default), not {}",
            settings.read_only_port
        ));
    }
    match authorizer {
        Some(authorizer) if problems.is_empty() => Ok(authorizer),
        _ => Err(Error::Unsupported { problems }),
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
/// `kubelet_http_requests_duration_seconds` of every request (upstream `ServeHTTP`).
async fn count_requests(
    State(metrics): State<Arc<crate::metrics::KubeletMetrics>>,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let path = metric_path_bucket(request.uri().path());
    let long_running = ["exec", "attach", "portforward", "debug"].contains(&path.as_str());
    let labels = crate::metrics::HttpLabels {
        method: metric_method_bucket(request.method()),
        path,
        server_type: "readwrite".into(),
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
    let gzip = metrics_format::accepts_gzip(text_header(&header::ACCEPT_ENCODING));
    let mut body = String::new();
    if let Err(error) = format.encode(&mut body, &registry) {
        tracing::error!(%error, "encoding metrics");
        return (StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed\n").into_response();
    }
    if !gzip {
        return ([(header::CONTENT_TYPE, format.content_type())], body).into_response();
    }
    match metrics_format::gzip(body.as_bytes()) {
        Ok(compressed) => {
            ([(header::CONTENT_TYPE, format.content_type()), (header::CONTENT_ENCODING, "gzip")], compressed)
                .into_response()
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
