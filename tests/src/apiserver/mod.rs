//! An in-memory Kubernetes API server double.
//!
//! Written while no `kube-apiserver` could run on the test machines. No test uses it any
//! more: every API-mode end-to-end test runs on the test bed's real control plane
//! ([`crate::cluster`]). It remains only behind `swiftlet-test-apiserver`, the API server
//! of `cargo xtask bench`'s pod start-up and eviction figures, until the bench moves onto
//! the real control plane (issue 27); then it goes. It speaks the real wire protocol (JSON over
//! HTTP/1.1, or HTTPS with a throw-away CA; bearer tokens; `metav1.Status` errors;
//! newline-delimited watch events) and, wherever a client could tell the difference,
//! follows the real server (`staging/src/k8s.io/apiserver`, `pkg/registry/core/*`,
//! `pkg/apis/core/v1/defaults.go`, the admission plugins): each submodule says which
//! upstream code it follows.
//!
//! - `store`: one global resourceVersion, per-resource watch history (410 Expired when
//!   a resume is older);
//! - `registry`: create/get/list/update/delete with optimistic concurrency, the status
//!   subresource, pod graceful deletion, finalizers, namespace lifecycle;
//! - `admission`: pod defaults and the `ServiceAccount`, Priority and
//!   `DefaultTolerationSeconds` plugins, pod status Pending + `qosClass`;
//! - `patch`: merge, JSON and strategic merge patches;
//! - `resize`: the `pods/resize` subresource (`ValidatePodResize`);
//! - `ephemeral`: the `pods/ephemeralcontainers` subresource (`kubectl debug`;
//!   `ValidatePodEphemeralContainersUpdate`);
//! - `watch`: watches with resume, selectors applied to old and new state, bookmarks;
//! - `auth`: static tokens, `TokenRequest`, `TokenReview`, `SubjectAccessReview` answers
//!   (everything allowed, denied, a predicate, or a kubelet's `nodes/<subresource>` rules),
//!   and [`TestApiServer::reviews`] lists the reviews clients posted;
//! - `tls`: the cluster CA, the serving certificate, and client-certificate
//!   authentication over HTTPS (the x509 authenticator: user = subject CN, groups =
//!   subject O; a certificate that does not verify is a 401; a valid certificate wins
//!   over a bearer token, as in the real union authenticator);
//! - `certificates`: `CertificateSigningRequests` (`certificates.k8s.io/v1`) with the
//!   `/status` and `/approval` subresources, the requester's identity in the spec, and
//!   their validation;
//! - `csr_controller`: a stand-in for kube-controller-manager's CSR approver and signer
//!   for the kubelet signers ([`CsrController`]: off by default).
//!
//! Not served: protobuf, tables, aggregated discovery, `OpenAPI`, `/log`, `/exec`,
//! server-side apply field management (apply is a merge that may create), garbage
//! collection (`propagationPolicy` is ignored), RBAC on requests, snapshots of the past
//! (`resourceVersionMatch=Exact` of an old version is 410), `managedFields`, event TTLs,
//! anonymous requests (every path, `/version` and `/healthz` included, needs a token or
//! a client certificate: the real server with `--anonymous-auth=false`), most validation
//! (names, pod containers and pod-update immutability are checked), other resources,
//! signing for other CSR signers (`kube-apiserver-client`, `legacy-unknown`), the CSR
//! validation allowances for invalid stored data, `ClusterTrustBundles`, and client
//! certificates over plain HTTP.
//!
//! Test controls: [`TestApiServer`] starts it on 127.0.0.1, writes a kubeconfig, gives
//! typed access to the store (`create`, `get`, `list`, `modify`, `delete`, `wait_for`),
//! records requests, injects failures, stops and restarts it on the same port with the
//! stored data kept, issues client certificates from the cluster CA, writes kubeconfigs
//! with other credentials (a bootstrap token, a client certificate), and plays the CSR
//! controllers.

mod admission;
mod auth;
mod certificates;
mod csr_controller;
mod ephemeral;
mod http;
mod kubeconfig;
mod meta;
mod patch;
mod registry;
mod resize;
mod resources;
mod selector;
mod status;
mod store;
#[cfg(test)]
mod tests;
mod tls;
mod views;
mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use auth::{Authorizer, AuthorizerFn, UserInfo};
pub use csr_controller::CsrController;
pub use status::StatusError;

use registry::{Ctx, DeleteOpts, Part};
use resources::ResourceInfo;
use store::Store;

/// Errors of the test server's controls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding 127.0.0.1:{port}")]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the kubeconfig")]
    Kubeconfig(#[source] std::io::Error),
    #[error("generating or issuing a certificate: {0}")]
    Tls(String),
    #[error("the API server double does not serve {0}")]
    UnknownResource(String),
    #[error(transparent)]
    Api(#[from] StatusError),
    #[error("(de)serializing the object")]
    Json(#[from] serde_json::Error),
    #[error("building the kube client")]
    Client(#[from] kube::Error),
    #[error("reading the kubeconfig")]
    ClientConfig(#[from] kube::config::KubeconfigError),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// Result of the test controls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the server starts.
#[derive(Clone, Debug)]
pub struct Options {
    /// The port on 127.0.0.1; default 0 (any free port; see [`TestApiServer::port`]).
    pub port: u16,
    /// Serve HTTPS with a generated CA (in the kubeconfig); default false (plain HTTP).
    pub tls: bool,
    /// The kubeconfig user's bearer token; it authenticates as `admin` in
    /// `system:masters`. Default `swiftlet-test-token`.
    pub token: String,
    /// More tokens and who they are (requests and `TokenReviews`); default none.
    pub tokens: HashMap<String, UserInfo>,
    /// How `SubjectAccessReviews` are answered; default [`Authorizer::AllowAll`].
    pub authorizer: Authorizer,
    /// Events kept per resource for watches to resume from; default 1000.
    pub watch_history: usize,
    /// Interval of BOOKMARK events on watches that allow them; default 60 s (the real
    /// server's bookmark frequency).
    pub bookmark_interval: Duration,
    /// The `ServiceAccount` admission plugin mounts a `kube-api-access-*` projected token
    /// volume in pods, as the real one does by default; default false here (the agent's
    /// tests opt in), and then `kube-root-ca.crt` exists in every namespace.
    pub mount_service_account_token: bool,
    /// Issuer of service-account tokens, also the API audience; default
    /// `https://kubernetes.default.svc.cluster.local`.
    pub service_account_issuer: String,
    /// Keep the watch history across [`TestApiServer::restart`]; default false: a
    /// restarted server's watch cache starts at the current resourceVersion, so watches
    /// resuming from an older one get 410 and relist, as against a restarted real server.
    pub keep_watch_history_on_restart: bool,
    /// What the stand-in kube-controller-manager does with CSRs; default
    /// [`CsrController::Off`] (they stay pending). See [`TestApiServer::set_csr_controller`].
    pub csr_controller: CsrController,
}

/// The bearer token of the kubeconfig by default.
pub const DEFAULT_TOKEN: &str = "swiftlet-test-token";

impl Default for Options {
    fn default() -> Self {
        Self {
            port: 0,
            tls: false,
            token: DEFAULT_TOKEN.into(),
            tokens: HashMap::new(),
            authorizer: Authorizer::AllowAll,
            watch_history: 1000,
            bookmark_interval: Duration::from_mins(1),
            mount_service_account_token: false,
            service_account_issuer: "https://kubernetes.default.svc.cluster.local".into(),
            keep_watch_history_on_restart: false,
            csr_controller: CsrController::Off,
        }
    }
}

/// One request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Arrival order (from 1).
    pub seq: u64,
    pub method: String,
    pub path: String,
    /// The raw query string.
    pub query: String,
    pub user_agent: Option<String>,
    pub content_type: Option<String>,
    /// The body (lossy UTF-8).
    pub body: String,
    /// The authenticated user, if any.
    pub user: Option<String>,
    /// The response code; 0 while the request is being served (watches: 200 at once).
    pub status: u16,
}

impl RecordedRequest {
    /// A decoded query parameter.
    #[must_use]
    pub fn query_param(&self, name: &str) -> Option<String> {
        http::parse_query(&self.query).remove(name)
    }

    /// A watch request.
    #[must_use]
    pub fn is_watch(&self) -> bool {
        self.query_param("watch").is_some_and(|w| w == "true" || w == "1")
    }

    /// The body as JSON.
    #[must_use]
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// What an injected failure does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMode {
    /// Answer with this HTTP code and a matching Status (`Retry-After: 1` on 429/503/504).
    Status(u16),
    /// Never answer until the failure is cleared (then serve normally) or the server stops.
    Hang,
}

/// A request matcher for [`Failure::matching`].
pub type RequestMatcher = dyn Fn(&RecordedRequest) -> bool + Send + Sync;

/// An injected failure: what, for which requests, how many times.
#[derive(Clone)]
pub struct Failure {
    mode: FailureMode,
    matcher: Option<Arc<RequestMatcher>>,
    remaining: Option<usize>,
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failure")
            .field("mode", &self.mode)
            .field("matcher", &self.matcher.as_ref().map(|_| ".."))
            .field("remaining", &self.remaining)
            .finish()
    }
}

impl Failure {
    /// Every request is answered with `code`.
    #[must_use]
    pub fn status(code: u16) -> Self {
        Self { mode: FailureMode::Status(code), matcher: None, remaining: None }
    }

    /// Every request hangs.
    #[must_use]
    pub fn hang() -> Self {
        Self { mode: FailureMode::Hang, matcher: None, remaining: None }
    }

    /// Only requests that `pred` accepts.
    #[must_use]
    pub fn matching(mut self, pred: impl Fn(&RecordedRequest) -> bool + Send + Sync + 'static) -> Self {
        self.matcher = Some(Arc::new(pred));
        self
    }

    /// Only the next `n` matching requests.
    #[must_use]
    pub fn times(mut self, n: usize) -> Self {
        self.remaining = Some(n);
        self
    }

    fn applies(&self, r: &RecordedRequest) -> bool {
        self.remaining != Some(0) && self.matcher.as_ref().is_none_or(|m| m(r))
    }
}

/// The injected failures.
#[derive(Debug)]
struct Failures {
    rules: Mutex<Vec<Failure>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Failures {
    fn check(&self, r: &RecordedRequest) -> Option<FailureMode> {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        let f = rules.iter_mut().find(|f| f.applies(r))?;
        if let Some(n) = f.remaining.as_mut() {
            *n -= 1;
        }
        let mode = f.mode;
        rules.retain(|f| f.remaining != Some(0) || f.mode == FailureMode::Hang);
        Some(mode)
    }

    fn still_hangs(&self, r: &RecordedRequest) -> bool {
        let rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        rules.iter().any(|f| f.mode == FailureMode::Hang && f.matcher.as_ref().is_none_or(|m| m(r)))
    }

    /// Waits while a hang rule matches; false if the server stopped meanwhile.
    async fn hang(&self, r: &RecordedRequest, cancel: &CancellationToken) -> bool {
        let mut rx = self.changed.subscribe();
        while self.still_hangs(r) {
            tokio::select! {
                () = cancel.cancelled() => return false,
                res = rx.changed() => if res.is_err() { return false },
            }
        }
        true
    }

    fn set(&self, f: impl FnOnce(&mut Vec<Failure>)) {
        f(&mut self.rules.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.send_modify(|g| *g += 1);
    }
}

/// The client's certificate chain of a TLS connection, if it sent one.
type PeerCertificates = Option<Arc<[rustls::pki_types::CertificateDer<'static>]>>;

/// State shared by every connection, surviving restarts.
#[derive(Debug)]
struct Shared {
    store: Arc<Store>,
    /// The cluster CA (also when serving plain HTTP: the CSR signer signs with it).
    ca: Arc<tls::ClusterCa>,
    csr_controller: tokio::sync::watch::Sender<CsrController>,
    auth: auth::Auth,
    opts: Options,
    failures: Failures,
    requests: Mutex<(u64, Vec<RecordedRequest>)>,
    server_address: String,
}

impl Shared {
    fn record(&self, mut r: RecordedRequest) -> u64 {
        let mut g = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        g.0 += 1;
        r.seq = g.0;
        g.1.push(r);
        g.0
    }

    fn finish_record(&self, seq: u64, status: u16, user: Option<String>) {
        let mut g = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = g.1.iter_mut().rev().find(|r| r.seq == seq) {
            r.status = status;
            r.user = user;
        }
    }
}

/// One run of the listener (between start/restart and stop).
#[derive(Debug)]
struct Running {
    cancel: CancellationToken,
    accept: JoinHandle<()>,
    connections: TaskTracker,
}

/// A running API server double. Dropping it stops the server.
#[derive(Debug)]
pub struct TestApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    running: Mutex<Option<Running>>,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestApiServer {
    /// Starts the server on 127.0.0.1 (the namespaces `default`, `kube-system`,
    /// `kube-public` and `kube-node-lease` exist, each with its `default` service
    /// account) and writes a kubeconfig for it.
    pub async fn start(opts: Options) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = TcpListener::bind(("127.0.0.1", opts.port))
            .await
            .map_err(|source| Error::Bind { port: opts.port, source })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind { port: opts.port, source })?;
        let ca = Arc::new(tls::ClusterCa::generate().map_err(Error::Tls)?);
        let tls = if opts.tls { Some(ca.server_config().map_err(Error::Tls)?) } else { None };
        let ca_pem = tls.as_ref().map(|_| ca.pem.clone());
        let mut tokens = opts.tokens.clone();
        tokens.insert(opts.token.clone(), UserInfo::new("admin", &["system:masters"]));
        let store = Arc::new(Store::new(opts.watch_history));
        let shared = Arc::new(Shared {
            auth: auth::Auth::new(opts.service_account_issuer.clone(), tokens, opts.authorizer.clone()),
            store,
            ca,
            csr_controller: tokio::sync::watch::channel(opts.csr_controller.clone()).0,
            failures: Failures { rules: Mutex::new(Vec::new()), changed: tokio::sync::watch::channel(0).0 },
            requests: Mutex::new((0, Vec::new())),
            server_address: addr.to_string(),
            opts,
        });
        seed(&shared, ca_pem.as_deref(), addr.port());
        let dir = tempfile::Builder::new().prefix("swiftlet-apiserver-").tempdir().map_err(Error::Kubeconfig)?;
        let url = format!("{}://{addr}", if tls.is_some() { "https" } else { "http" });
        let text = kubeconfig::render(&url, ca_pem.as_deref(), &shared.opts.token);
        let kubeconfig = kubeconfig::write(dir.path(), &text).map_err(Error::Kubeconfig)?;
        let server = Self { shared, addr, tls, running: Mutex::new(None), kubeconfig, _dir: dir };
        server.serve(listener);
        Ok(server)
    }

    fn serve(&self, listener: TcpListener) {
        let cancel = CancellationToken::new();
        let connections = TaskTracker::new();
        let accept = tokio::spawn(accept_loop(
            listener,
            self.shared.clone(),
            self.tls.as_ref().map(|t| tokio_rustls::TlsAcceptor::from(t.clone())),
            cancel.clone(),
            connections.clone(),
        ));
        connections.spawn(csr_controller::run(self.shared.clone(), cancel.clone()));
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = Some(Running { cancel, accept, connections });
    }

    /// `http://127.0.0.1:<port>` or `https://...`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("{}://{}", if self.tls.is_some() { "https" } else { "http" }, self.addr)
    }

    /// The bound port (stays the same across restarts).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The kubeconfig written at start (in a directory removed with the server).
    #[must_use]
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes `<dir>/kubeconfig` for this server and returns its path.
    pub fn write_kubeconfig(&self, dir: &Path) -> Result<PathBuf> {
        let text = kubeconfig::render(&self.url(), self.ca_pem(), &self.shared.opts.token);
        kubeconfig::write(dir, &text).map_err(Error::Kubeconfig)
    }

    /// Writes `<dir>/<file_name>`, a kubeconfig for this server whose user has `token`
    /// (a bootstrap kubeconfig, say), and returns its path.
    pub fn write_kubeconfig_with_token(&self, dir: &Path, file_name: &str, token: &str) -> Result<PathBuf> {
        let text = kubeconfig::render(&self.url(), self.ca_pem(), token);
        kubeconfig::write_named(dir, file_name, &text).map_err(Error::Kubeconfig)
    }

    /// Writes `<dir>/<file_name>`, a kubeconfig for this server whose user
    /// authenticates with a client certificate (PEM, with its key), and returns its path.
    pub fn write_kubeconfig_with_client_cert(
        &self,
        dir: &Path,
        file_name: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<PathBuf> {
        let text = kubeconfig::render_cert(&self.url(), self.ca_pem(), cert_pem, key_pem);
        kubeconfig::write_named(dir, file_name, &text).map_err(Error::Kubeconfig)
    }

    /// The CA certificate (PEM) when serving HTTPS: the cluster CA, which signs the
    /// serving certificate, the client certificates the server accepts, and the
    /// certificates the CSR signer issues.
    #[must_use]
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|_| self.shared.ca.pem.as_str())
    }

    /// The cluster CA certificate (PEM), also when serving plain HTTP.
    #[must_use]
    pub fn cluster_ca_pem(&self) -> &str {
        &self.shared.ca.pem
    }

    /// A new key and a client certificate for it signed by the cluster CA (PEM, PEM):
    /// subject CN `cn` and O `orgs` (the user and groups the server authenticates it as,
    /// over HTTPS), `clientAuth`, valid from 5 minutes ago (the signer's backdate) for
    /// `valid_for`.
    pub fn issue_client_cert(&self, cn: &str, orgs: &[&str], valid_for: Duration) -> Result<(String, String)> {
        let now = SystemTime::now();
        let backdated = now.checked_sub(Duration::from_mins(5)).unwrap_or(now);
        self.issue_client_cert_between(cn, orgs, backdated, now + valid_for)
    }

    /// As [`Self::issue_client_cert`], valid from `not_before` to `not_after` (in the past
    /// for an expired certificate, in the future for one not yet valid).
    pub fn issue_client_cert_between(
        &self,
        cn: &str,
        orgs: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<(String, String)> {
        let secs = |t: SystemTime| match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        };
        self.shared.ca.issue_client(cn, orgs, secs(not_before), secs(not_after)).map_err(Error::Tls)
    }

    /// A real `kube::Client` that authenticates with a client certificate (PEM, with its
    /// key) and no token (HTTPS servers only).
    pub async fn client_with_cert(&self, cert_pem: &str, key_pem: &str) -> Result<kube::Client> {
        let text = kubeconfig::render_cert(&self.url(), self.ca_pem(), cert_pem, key_pem);
        let kc = kube::config::Kubeconfig::from_yaml(&text)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// Changes what the stand-in kube-controller-manager does with CSRs; pending CSRs
    /// are handled at once under the new setting.
    pub fn set_csr_controller(&self, ctl: CsrController) {
        self.shared.csr_controller.send_replace(ctl);
    }

    /// The PEM certificate a CSR was issued (`status.certificate`), once signed.
    #[must_use]
    pub fn csr_pem_certificate(&self, name: &str) -> Option<String> {
        use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
        let csr: CertificateSigningRequest = self.get(None, name)?;
        let cert = csr.status?.certificate?;
        (!cert.0.is_empty()).then(|| String::from_utf8_lossy(&cert.0).into_owned())
    }

    /// The kubeconfig user's bearer token.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.shared.opts.token
    }

    /// A real `kube::Client` from the kubeconfig.
    pub async fn client(&self) -> Result<kube::Client> {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// Whether the server is accepting connections.
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.running.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// Stops the server at once, as a crash: the port is closed, open connections
    /// (watches included) are cut. The stored data stays.
    pub async fn stop(&self) {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(r) = running {
            r.cancel.cancel();
            r.accept.abort();
            let _ = r.accept.await;
            r.connections.close();
            r.connections.wait().await;
        }
    }

    /// Starts the server again on the same port with the same data (and CA, token and
    /// kubeconfig). Unless [`Options::keep_watch_history_on_restart`], the watch history
    /// starts anew at the current resourceVersion.
    pub async fn restart(&self) -> Result<()> {
        self.stop().await;
        let port = self.addr.port();
        let listener = TcpListener::bind(self.addr).await.map_err(|source| Error::Bind { port, source })?;
        if !self.shared.opts.keep_watch_history_on_restart {
            self.shared.store.lock().reset_history();
        }
        self.serve(listener);
        Ok(())
    }

    /// The requests served so far, in arrival order.
    #[must_use]
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().unwrap_or_else(PoisonError::into_inner).1.clone()
    }

    /// The bodies of the `TokenReviews` (`kind` `"tokenreviews"`) or
    /// `SubjectAccessReviews` (`"subjectaccessreviews"`) posted so far, in arrival order.
    /// (`TokenReview` bodies hold the token: this is a test server.)
    #[must_use]
    pub fn reviews(&self, kind: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.rsplit('/').next() == Some(kind))
            .filter_map(|r| r.body_json())
            .collect()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared.requests.lock().unwrap_or_else(PoisonError::into_inner).1.clear();
    }

    /// Adds an injected failure (checked in the order added; the first that matches applies).
    pub fn fail_requests(&self, failure: Failure) {
        self.shared.failures.set(|r| r.push(failure));
    }

    /// Removes every injected failure; hanging requests are then served.
    pub fn clear_failures(&self) {
        self.shared.failures.set(Vec::clear);
    }

    /// Changes how `SubjectAccessReviews` are answered.
    pub fn set_authorizer(&self, authorizer: Authorizer) {
        self.shared.auth.set_authorizer(authorizer);
    }

    /// Adds (or replaces) a static bearer token.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.shared.auth.add_token(token, user);
    }

    /// The current resourceVersion.
    #[must_use]
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().rv()
    }

    /// Forgets the watch history (an etcd compaction): any watch resuming from an older
    /// resourceVersion gets 410 Expired.
    pub fn compact(&self) {
        self.shared.store.lock().reset_history();
    }

    fn info<K: k8s_openapi::Resource>() -> Result<&'static ResourceInfo> {
        resources::find(K::GROUP, K::VERSION, K::URL_PATH_SEGMENT)
            .filter(|i| !i.review)
            .ok_or_else(|| Error::UnknownResource(format!("{}/{}", K::API_VERSION, K::KIND)))
    }

    fn ctx(&self) -> Ctx<'static> {
        Ctx { dry_run: false, mount_token: self.shared.opts.mount_service_account_token, user: None }
    }

    /// Who the typed controls act as: the kubeconfig's user.
    fn admin() -> UserInfo {
        UserInfo::new("admin", &["system:masters", "system:authenticated"])
    }

    /// Creates an object as a client would (defaults and admission apply); namespaced
    /// objects without a namespace go to `default`.
    pub fn create<K>(&self, obj: &K) -> Result<K>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let info = Self::info::<K>()?;
        let v = serde_json::to_value(obj)?;
        let ns = if info.namespaced {
            Some(meta::namespace(&v).to_string()).filter(|n| !n.is_empty()).or_else(|| Some("default".into()))
        } else {
            None
        };
        let admin = Self::admin();
        let ctx = Ctx { user: Some(&admin), ..self.ctx() };
        let out = registry::create(&mut self.shared.store.lock(), ctx, info, ns.as_deref(), v)?;
        Ok(serde_json::from_value(out)?)
    }

    /// One object (`namespace` None for cluster-scoped kinds).
    #[must_use]
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let info = Self::info::<K>().ok()?;
        let v = registry::get(&self.shared.store.lock(), info, namespace, name).ok()?;
        serde_json::from_value(v).ok()
    }

    /// Every object of a kind, in one namespace or (None) all.
    #[must_use]
    pub fn list<K>(&self, namespace: Option<&str>) -> Vec<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let Ok(info) = Self::info::<K>() else { return Vec::new() };
        let d = self.shared.store.lock();
        d.iter(info.storage, namespace).filter_map(|o| serde_json::from_value(views::to_view(info, o)).ok()).collect()
    }

    /// Replaces an object (PUT semantics, including the resourceVersion check when set).
    pub fn update<K>(&self, obj: &K) -> Result<K>
    where
        K: k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
            + Serialize
            + DeserializeOwned,
    {
        self.put(obj, Part::Main)
    }

    /// Replaces an object's status (PUT `/status` semantics).
    pub fn update_status<K>(&self, obj: &K) -> Result<K>
    where
        K: k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
            + Serialize
            + DeserializeOwned,
    {
        self.put(obj, Part::Status)
    }

    fn put<K>(&self, obj: &K, part: Part) -> Result<K>
    where
        K: k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
            + Serialize
            + DeserializeOwned,
    {
        let info = Self::info::<K>()?;
        let m = obj.metadata();
        let name = m.name.clone().unwrap_or_default();
        let ns = if info.namespaced { Some(m.namespace.clone().unwrap_or_else(|| "default".into())) } else { None };
        let v = serde_json::to_value(obj)?;
        let u = registry::update(
            &mut self.shared.store.lock(),
            self.ctx(),
            info,
            ns.as_deref(),
            &name,
            part,
            false,
            |_| Ok(v),
        )?;
        Ok(serde_json::from_value(u.object)?)
    }

    /// Changes an object in place, atomically (no conflict possible); `status` selects
    /// the status subresource's rules.
    pub fn modify<K>(&self, namespace: Option<&str>, name: &str, status: bool, f: impl FnOnce(&mut K)) -> Result<K>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let info = Self::info::<K>()?;
        let part = if status { Part::Status } else { Part::Main };
        let u =
            registry::update(&mut self.shared.store.lock(), self.ctx(), info, namespace, name, part, false, |cur| {
                let cur = cur.ok_or_else(|| StatusError::not_found(info, name))?;
                let mut k: K = serde_json::from_value(cur.clone())
                    .map_err(|e| StatusError::internal(&format!("decoding {name}: {e}")))?;
                f(&mut k);
                serde_json::to_value(&k).map_err(|e| StatusError::internal(&format!("encoding {name}: {e}")))
            })?;
        Ok(serde_json::from_value(u.object)?)
    }

    /// Deletes an object as a client would: Some(object) while deletion is pending
    /// (graceful pod deletion, finalizers), None once it is gone.
    pub fn delete<K>(&self, namespace: Option<&str>, name: &str, grace_period_seconds: Option<i64>) -> Result<Option<K>>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let info = Self::info::<K>()?;
        let opts = DeleteOpts { grace_period_seconds, ..DeleteOpts::default() };
        let d = registry::delete(&mut self.shared.store.lock(), self.ctx(), info, namespace, name, &opts)?;
        if d.removed { Ok(None) } else { Ok(Some(serde_json::from_value(d.object)?)) }
    }

    /// Waits until `pred` holds for the object (None: absent), driven by the store's
    /// events rather than polling; returns the object as it was then.
    pub async fn wait_for<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        timeout: Duration,
        pred: impl Fn(Option<&K>) -> bool,
    ) -> Result<Option<K>>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let info = Self::info::<K>()?;
        let mut rx = self.shared.store.lock().subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let cur: Option<K> = self.get(namespace, name);
            if pred(cur.as_ref()) {
                return Ok(cur);
            }
            // Any change of this kind of object wakes us up; a lag just means re-checking.
            loop {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Err(_) | Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => {
                        return Err(Error::Timeout(timeout));
                    }
                    Ok(Ok(e)) if e.storage != info.storage => {}
                    Ok(Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => break,
                }
            }
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if let Some(r) = self.running.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            r.cancel.cancel();
            r.accept.abort();
        }
    }
}

/// The objects a fresh cluster has: the system namespaces with their `default` service
/// accounts (and, when tokens are mounted, `kube-root-ca.crt`), and the `kubernetes`
/// service in `default` on the first address of the service CIDR (10.96.0.1:443 → the
/// server's port, as the real server's controller keeps it).
fn seed(shared: &Shared, ca_pem: Option<&str>, port: u16) {
    let ns_info = resources::find("", "v1", "namespaces").expect("served");
    let cm_info = resources::find("", "v1", "configmaps").expect("served");
    let svc_info = resources::find("", "v1", "services").expect("served");
    let mut d = shared.store.lock();
    let kubernetes = serde_json::json!({
        "metadata": { "name": "kubernetes", "labels": { "component": "apiserver", "provider": "kubernetes" } },
        "spec": {
            "clusterIP": "10.96.0.1",
            "ports": [{ "name": "https", "port": 443, "protocol": "TCP", "targetPort": port }],
        },
    });
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = serde_json::json!({ "metadata": { "name": ns } });
        let _ = registry::create(&mut d, Ctx::default(), ns_info, None, obj);
        if shared.opts.mount_service_account_token {
            let ca = ca_pem.unwrap_or("");
            let cm = serde_json::json!({ "metadata": { "name": "kube-root-ca.crt" }, "data": { "ca.crt": ca } });
            let _ = registry::create(&mut d, Ctx::default(), cm_info, Some(ns), cm);
        }
    }
    let _ = registry::create(&mut d, Ctx::default(), svc_info, Some("default"), kubernetes);
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    cancel: CancellationToken,
    connections: TaskTracker,
) {
    loop {
        let (stream, _) = tokio::select! {
            () = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(_) => continue,
            },
        };
        let shared = shared.clone();
        let cancel = cancel.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let conn_cancel = cancel.clone();
            let serve = async move {
                let service = |peer: PeerCertificates| {
                    hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        let cancel = cancel.clone();
                        let peer = peer.clone();
                        async move { Ok::<_, std::convert::Infallible>(http::handle(shared, cancel, peer, req).await) }
                    })
                };
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(stream).await {
                            let peer: PeerCertificates = s
                                .get_ref()
                                .1
                                .peer_certificates()
                                .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
                            let _ = builder.serve_connection(TokioIo::new(s), service(peer)).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(stream), service(None)).await;
                    }
                }
            };
            tokio::select! {
                () = conn_cancel.cancelled() => {}
                () = serve => {}
            }
        });
    }
}
