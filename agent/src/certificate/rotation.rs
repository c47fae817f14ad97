//! Certificate rotation (client-go's certificate manager): the client certificate
//! (`rotateCertificates`) and the serving certificate (`serverTLSBootstrap`), and API
//! clients that follow the current client pair.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::csr::{self, ROTATION_WAIT};
use super::store::{FileStore, Pair};
use super::{NODES_GROUP, Result, node_common_name};

/// Waits after failed rotations (client-go: 2 s doubling, five steps), then every 32 s.
const RETRY_DELAYS: [Duration; 5] = [
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(32),
];
const RETRY_AFTER_BACKOFF: Duration = Duration::from_secs(32);

/// How long the agent goes on without a valid client certificate before it exits
/// (upstream's `exitAfter`): its credentials cannot get it a new one, and a restart lets
/// the bootstrap credentials (or whoever supervises it) lay down new ones.
pub const EXIT_WITHOUT_CERTIFICATE: Duration = Duration::from_mins(5);

/// Which of the kubelet's certificates a manager keeps: its signer, usages, file prefix
/// and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// `client` or `serving`, for logs.
    pub what: &'static str,
    pub signer: &'static str,
    /// Usages of an ECDSA key (upstream's `DefaultKubelet{Client,Serving}GetUsages`).
    pub usages: &'static [&'static str],
    /// The store's file prefix.
    pub prefix: &'static str,
    ttl_metric: &'static str,
    ttl_help: &'static str,
    errors_metric: &'static str,
    /// `kubelet_certificate_manager_server_rotation_seconds` (serving only, as upstream).
    rotation_metric: Option<&'static str>,
}

/// The kubelet's client certificate.
pub const CLIENT: Kind = Kind {
    what: "client",
    signer: csr::KUBELET_CLIENT_SIGNER,
    usages: csr::CLIENT_USAGES,
    prefix: "kubelet-client",
    ttl_metric: "kubelet_certificate_manager_client_ttl_seconds",
    ttl_help: "[ALPHA] Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds \
               until certificate expiry (negative if already expired). If client certificate is invalid or unused, \
               the value will be +INF.",
    errors_metric: "kubelet_certificate_manager_client_expiration_renew_errors",
    rotation_metric: None,
};

/// The kubelet's serving certificate (`serverTLSBootstrap`).
pub const SERVING: Kind = Kind {
    what: "serving",
    signer: csr::KUBELET_SERVING_SIGNER,
    usages: &["digital signature", "server auth"],
    prefix: "kubelet-server",
    ttl_metric: "kubelet_certificate_manager_server_ttl_seconds",
    ttl_help: "[ALPHA] Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is \
               in seconds until certificate expiry (negative if already expired). If serving certificate is invalid \
               or unused, the value will be +INF.",
    errors_metric: "kubelet_server_expiration_renew_errors",
    rotation_metric: Some("kubelet_certificate_manager_server_rotation_seconds"),
};

/// Buckets of `kubelet_certificate_manager_server_rotation_seconds` (upstream's: a
/// minute to four years).
const ROTATION_BUCKETS: [f64; 10] =
    [60.0, 3600.0, 14400.0, 86400.0, 604_800.0, 2_592_000.0, 7_776_000.0, 15_552_000.0, 31_104_000.0, 124_416_000.0];

/// Keeps one of the agent's certificates current: requests it when there is none,
/// rotates it before it expires, and tells subscribers (the API clients, the HTTPS
/// server) of each new pair.
pub struct CertManager {
    kind: Kind,
    store: FileStore,
    node: String,
    /// The DNS names and IP addresses the certificate must cover (serving).
    names: Vec<String>,
    current: watch::Sender<Option<Arc<Pair>>>,
    renew_errors: Counter,
    rotation_age: Histogram,
}

impl std::fmt::Debug for CertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManager").field("kind", &self.kind.what).field("node", &self.node).finish_non_exhaustive()
    }
}

impl CertManager {
    /// A manager of `node`'s `kind` certificate covering `names`, starting from
    /// `initial` (none: request one at once), storing new pairs in `store`.
    #[must_use]
    pub fn new(kind: Kind, store: FileStore, node: &str, names: Vec<String>, initial: Option<Pair>) -> Arc<Self> {
        let (current, _) = watch::channel(initial.map(Arc::new));
        Arc::new(Self {
            kind,
            store,
            node: node.to_owned(),
            names,
            current,
            renew_errors: Counter::default(),
            rotation_age: Histogram::new(ROTATION_BUCKETS),
        })
    }

    /// Registers the metrics: the TTL gauge (seconds until the current certificate
    /// expires, +Inf without one), the renewal error counter and, for the serving
    /// certificate, the age of certificates when rotated.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            self.kind.errors_metric,
            "[ALPHA] Counter of certificate renewal errors.",
            self.renew_errors.clone(),
        );
        if let Some(name) = self.kind.rotation_metric {
            registry.register(
                name,
                "[ALPHA] Histogram of the number of seconds the previous certificate lived before being rotated.",
                self.rotation_age.clone(),
            );
        }
        registry.register_collector(Box::new(TtlCollector { kind: self.kind, current: self.current.subscribe() }));
    }

    /// The current pair.
    #[must_use]
    pub fn current(&self) -> Option<Arc<Pair>> {
        self.current.borrow().clone()
    }

    /// Each new pair, as it is stored.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Pair>>> {
        self.current.subscribe()
    }

    /// Whether `pair` is what this manager would request: the node's common name in
    /// `system:nodes`, and every name it must cover (client-go's template check; extra
    /// names do not matter).
    #[must_use]
    pub fn satisfies_template(&self, pair: &Pair) -> bool {
        pair.common_name == node_common_name(&self.node)
            && pair.organizations.iter().any(|o| o == NODES_GROUP)
            && self.names.iter().all(|n| pair.names.contains(n))
    }

    /// When to rotate: at `fraction` (70 to 90 %, drawn per deadline) of the current
    /// pair's lifetime; now without a pair or when it does not satisfy the template.
    #[must_use]
    pub fn deadline(&self, pair: Option<&Pair>, fraction: f64) -> SystemTime {
        match pair {
            Some(pair) if self.satisfies_template(pair) => {
                let total = pair.not_after.duration_since(pair.not_before).unwrap_or_default();
                pair.not_before + total.mul_f64(fraction.clamp(0.0, 1.0))
            }
            _ => SystemTime::now(),
        }
    }

    /// Requests a new key's certificate with `client`, stores the pair and makes it
    /// current.
    pub async fn rotate(&self, client: &kube::Client) -> Result<Arc<Pair>> {
        let key = csr::generate_key()?;
        let request = csr::node_request(&key, &self.node, &self.names)?;
        let (name, uid) = csr::submit(client, None, &request, self.kind.signer, self.kind.usages).await?;
        tracing::info!(csr = %name, certificate = self.kind.what, "requested a new certificate");
        let cert = csr::wait_for_certificate(client, &name, &uid, ROTATION_WAIT).await?;
        let pair = Arc::new(self.store.update(&cert, &key.serialize_pem())?);
        if let Some(old) = self.current.send_replace(Some(pair.clone())) {
            let age = SystemTime::now().duration_since(old.not_before).unwrap_or_default();
            self.rotation_age.observe(age.as_secs_f64());
        }
        Ok(pair)
    }

    /// Returns once there has been no valid (present, unexpired) certificate for
    /// `limit`, checking every `every`; never while one is valid.
    pub async fn without_valid_certificate_for(&self, limit: Duration, every: Duration) {
        let mut last_valid = tokio::time::Instant::now();
        loop {
            let valid = self.current().is_some_and(|p| !p.expired_at(SystemTime::now()));
            let now = tokio::time::Instant::now();
            if valid {
                last_valid = now;
            } else if now.duration_since(last_valid) >= limit {
                return;
            }
            tokio::time::sleep(every).await;
        }
    }

    /// [`Self::run`], handing each new pair to `apply` (the API clients, the HTTPS
    /// server) as it is stored.
    pub async fn run_applying(
        self: Arc<Self>,
        client: kube::Client,
        shutdown: CancellationToken,
        mut apply: impl FnMut(&Pair),
    ) {
        let mut pairs = self.subscribe();
        let applying = async {
            while pairs.changed().await.is_ok() {
                if let Some(pair) = pairs.borrow_and_update().clone() {
                    apply(&pair);
                }
            }
        };
        tokio::select! {
            () = self.clone().run(client, shutdown) => {}
            () = applying => {}
        }
    }

    /// Rotates before each certificate's deadline until `shutdown`.
    pub async fn run(self: Arc<Self>, client: kube::Client, shutdown: CancellationToken) {
        let what = self.kind.what;
        loop {
            let pair = self.current();
            let deadline = self.deadline(pair.as_deref(), rand::random_range(0.7..0.9));
            let wait = deadline.duration_since(SystemTime::now()).unwrap_or_default();
            if let Some(pair) = &pair {
                tracing::info!(
                    certificate = what,
                    expires = %rfc3339(pair.not_after),
                    rotation = %rfc3339(deadline),
                    "certificate rotation scheduled"
                );
            } else {
                tracing::info!(certificate = what, "no certificate yet: requesting one");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let mut failures = 0usize;
            loop {
                match self.rotate(&client).await {
                    Ok(new) => {
                        tracing::info!(certificate = what, expires = %rfc3339(new.not_after), "certificate rotated");
                        break;
                    }
                    Err(e) => {
                        self.renew_errors.inc();
                        let delay = RETRY_DELAYS.get(failures).copied().unwrap_or(RETRY_AFTER_BACKOFF);
                        failures += 1;
                        tracing::error!(certificate = what, error = %e, retry_in = ?delay, "certificate rotation failed");
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            }
        }
    }
}

/// `t` as RFC 3339, for logs.
fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map_or_else(|_| format!("{t:?}"), |t| t.round(jiff::Unit::Second).unwrap_or(t).to_string())
}

/// The TTL gauge, read at scrape time.
#[derive(Debug)]
struct TtlCollector {
    kind: Kind,
    current: watch::Receiver<Option<Arc<Pair>>>,
}

impl Collector for TtlCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let ttl = self.current.borrow().as_ref().map_or(f64::INFINITY, |p| p.ttl_secs(SystemTime::now()).trunc());
        ConstGauge::new(ttl).encode(encoder.encode_descriptor(
            self.kind.ttl_metric,
            self.kind.ttl_help,
            None,
            MetricType::Gauge,
        )?)
    }
}

/// A `kube::Client` whose requests go to whichever client is current: the API clients
/// are rebuilt with each new certificate and swapped in here, so every component's clone
/// of the client uses the new pair from its next request on (new connections, new TLS
/// handshakes). Requests under way, watches included, finish on the connection they
/// started on; the old pair stays valid until it expires, long after the rotation.
#[derive(Clone)]
pub struct RotatingClient(Arc<RwLock<kube::Client>>);

impl std::fmt::Debug for RotatingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RotatingClient")
    }
}

impl RotatingClient {
    /// A client that sends through `initial` until [`RotatingClient::swap`].
    #[must_use]
    pub fn new(initial: kube::Client) -> Self {
        Self(Arc::new(RwLock::new(initial)))
    }

    /// Sends every later request through `next`.
    pub fn swap(&self, next: kube::Client) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = next;
    }

    /// The `kube::Client` that the agent's components use, with `namespace` as its
    /// default namespace.
    #[must_use]
    pub fn client(&self, namespace: &str) -> kube::Client {
        kube::client::ClientBuilder::new(self.clone(), namespace).build()
    }
}

impl tower::Service<http::Request<kube::client::Body>> for RotatingClient {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Box::pin(async move { client.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::store::pair_pem;

    fn manager(dir: &std::path::Path, kind: Kind, node: &str, names: &[&str]) -> (Arc<CertManager>, Registry) {
        let (cert, key) = pair_pem("system:node:n1", -100, 900);
        let mut registry = Registry::default();
        let initial = Pair::parse(&cert, &key, dir).unwrap();
        let names = names.iter().map(|n| (*n).to_owned()).collect();
        let manager = CertManager::new(kind, FileStore::new(dir, kind.prefix, None), node, names, Some(initial));
        manager.register(&mut registry);
        (manager, registry)
    }

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    fn sample(text: &str, series: &str) -> f64 {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')).unwrap().parse().unwrap()
    }

    #[test]
    fn the_deadline_is_the_drawn_share_of_the_lifetime_or_now_for_another_node() {
        let dir = tempfile::tempdir().unwrap();
        let (m, _) = manager(dir.path(), CLIENT, "n1", &[]);
        let pair = m.current().unwrap();
        let life = pair.not_after.duration_since(pair.not_before).unwrap();
        assert_eq!(m.deadline(Some(&pair), 0.7), pair.not_before + life.mul_f64(0.7));
        assert_eq!(m.deadline(Some(&pair), 0.9), pair.not_before + life.mul_f64(0.9));
        let (other, _) = manager(dir.path(), CLIENT, "n2", &[]);
        let before = SystemTime::now();
        assert!(other.deadline(Some(&pair), 0.7) >= before && other.deadline(Some(&pair), 0.7) <= SystemTime::now());
        assert!(!other.satisfies_template(&pair));
        assert!(m.deadline(None, 0.7) <= SystemTime::now());
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_certificate_expired_for_the_whole_limit_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let (valid, _) = manager(dir.path(), CLIENT, "n1", &[]);
        let limit = Duration::from_mins(5);
        let every = Duration::from_secs(10);
        let waited = tokio::time::timeout(Duration::from_mins(30), valid.without_valid_certificate_for(limit, every));
        assert!(waited.await.is_err(), "a valid certificate never ends the wait");

        let (cert, key) = pair_pem("system:node:n1", -7200, -60);
        let expired = Pair::parse(&cert, &key, dir.path()).unwrap();
        let m =
            CertManager::new(CLIENT, FileStore::new(dir.path(), "kubelet-client", None), "n1", vec![], Some(expired));
        let start = tokio::time::Instant::now();
        m.without_valid_certificate_for(limit, every).await;
        let took = start.elapsed();
        assert!(took >= limit && took <= limit + every, "{took:?}");
    }

    #[test]
    fn a_serving_certificate_must_cover_every_name() {
        let dir = tempfile::tempdir().unwrap();
        let (m, _) = manager(dir.path(), SERVING, "n1", &["n1", "10.0.0.5"]);
        let pair = m.current().unwrap();
        assert!(pair.names.is_empty());
        assert!(!m.satisfies_template(&pair));
        let mut covering = (*pair).clone();
        covering.names = vec!["n1".into(), "10.0.0.5".into(), "extra".into()];
        assert!(m.satisfies_template(&covering));
    }

    #[test]
    fn the_client_metrics_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let (_m, registry) = manager(dir.path(), CLIENT, "n1", &[]);
        let text = encode(&registry);
        assert!(text.contains("# TYPE kubelet_certificate_manager_client_ttl_seconds gauge"), "{text}");
        let ttl = sample(&text, "kubelet_certificate_manager_client_ttl_seconds");
        assert!((800.0..=900.0).contains(&ttl) && ttl.fract() == 0.0, "{ttl}");
        assert!(text.contains("kubelet_certificate_manager_client_expiration_renew_errors_total 0"), "{text}");
        assert!(!text.contains("rotation_seconds"), "{text}");
    }

    #[test]
    fn the_serving_metrics_are_served_and_the_ttl_is_infinite_without_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let m = CertManager::new(SERVING, FileStore::new(dir.path(), "kubelet-server", None), "n1", vec![], None);
        let mut registry = Registry::default();
        m.register(&mut registry);
        let text = encode(&registry);
        let ttl = sample(&text, "kubelet_certificate_manager_server_ttl_seconds");
        assert!(ttl.is_infinite() && ttl > 0.0, "{text}");
        assert!(text.contains("kubelet_server_expiration_renew_errors_total 0"), "{text}");
        assert!(
            text.contains("kubelet_certificate_manager_server_rotation_seconds_bucket{le=\"124416000.0\"} 0"),
            "{text}"
        );
    }
}
