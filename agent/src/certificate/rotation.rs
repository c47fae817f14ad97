//! Client certificate rotation (`rotateCertificates`; client-go's certificate manager)
//! and API clients that follow the current pair.

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
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::csr::{self, CLIENT_USAGES, KUBELET_CLIENT_SIGNER, ROTATION_WAIT};
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

/// Keeps the agent's client certificate current: rotates it before it expires and
/// tells subscribers (the API clients) of each new pair.
pub struct ClientCertManager {
    store: FileStore,
    node: String,
    current: watch::Sender<Arc<Pair>>,
    renew_errors: Counter,
}

impl std::fmt::Debug for ClientCertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertManager").field("node", &self.node).finish_non_exhaustive()
    }
}

impl ClientCertManager {
    /// A manager of `node`'s certificate starting from `initial`, storing new pairs in
    /// `store`.
    #[must_use]
    pub fn new(store: FileStore, node: &str, initial: Pair) -> Arc<Self> {
        let (current, _) = watch::channel(Arc::new(initial));
        Arc::new(Self { store, node: node.to_owned(), current, renew_errors: Counter::default() })
    }

    /// Registers the metrics: `kubelet_certificate_manager_client_ttl_seconds` (seconds
    /// until the current certificate expires) and
    /// `kubelet_certificate_manager_client_expiration_renew_errors` (failed rotations).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubelet_certificate_manager_client_expiration_renew_errors",
            "[ALPHA] Counter of certificate renewal errors.",
            self.renew_errors.clone(),
        );
        registry.register_collector(Box::new(TtlCollector(self.current.subscribe())));
    }

    /// The current pair.
    #[must_use]
    pub fn current(&self) -> Arc<Pair> {
        self.current.borrow().clone()
    }

    /// Each new pair, as it is stored.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Arc<Pair>> {
        self.current.subscribe()
    }

    /// Whether `pair` is a certificate of this node (`system:node:<node>` in
    /// `system:nodes`); one that is not is replaced at once (client-go's template check).
    #[must_use]
    pub fn names_the_node(&self, pair: &Pair) -> bool {
        pair.common_name == node_common_name(&self.node) && pair.organizations.iter().any(|o| o == NODES_GROUP)
    }

    /// When to rotate `pair`: at `fraction` (70 to 90 %, drawn per deadline) of its
    /// lifetime; now when it does not name the node.
    #[must_use]
    pub fn deadline(&self, pair: &Pair, fraction: f64) -> SystemTime {
        if !self.names_the_node(pair) {
            return SystemTime::now();
        }
        let total = pair.not_after.duration_since(pair.not_before).unwrap_or_default();
        pair.not_before + total.mul_f64(fraction.clamp(0.0, 1.0))
    }

    /// Requests a new key's certificate with `client` (the agent's own credentials),
    /// stores the pair and makes it current.
    pub async fn rotate(&self, client: &kube::Client) -> Result<Arc<Pair>> {
        let key = csr::generate_key()?;
        let request = csr::node_client_request(&key, &self.node)?;
        let (name, uid) = csr::submit(client, None, &request, KUBELET_CLIENT_SIGNER, CLIENT_USAGES).await?;
        tracing::info!(csr = %name, "requested a new client certificate");
        let cert = csr::wait_for_certificate(client, &name, &uid, ROTATION_WAIT).await?;
        let pair = Arc::new(self.store.update(&cert, &key.serialize_pem())?);
        self.current.send_replace(pair.clone());
        Ok(pair)
    }

    /// Rotates before each certificate's deadline until `shutdown`.
    pub async fn run(self: Arc<Self>, client: kube::Client, shutdown: CancellationToken) {
        loop {
            let pair = self.current();
            let deadline = self.deadline(&pair, rand::random_range(0.7..0.9));
            let wait = deadline.duration_since(SystemTime::now()).unwrap_or_default();
            tracing::info!(
                expires = %rfc3339(pair.not_after),
                rotation = %rfc3339(deadline),
                "client certificate rotation scheduled"
            );
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let mut failures = 0usize;
            loop {
                match self.rotate(&client).await {
                    Ok(new) => {
                        tracing::info!(
                            expires = %rfc3339(new.not_after),
                            "client certificate rotated"
                        );
                        break;
                    }
                    Err(e) => {
                        self.renew_errors.inc();
                        let delay = RETRY_DELAYS.get(failures).copied().unwrap_or(RETRY_AFTER_BACKOFF);
                        failures += 1;
                        tracing::error!(error = %e, retry_in = ?delay, "client certificate rotation failed");
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

/// `kubelet_certificate_manager_client_ttl_seconds`, read at scrape time.
#[derive(Debug)]
struct TtlCollector(watch::Receiver<Arc<Pair>>);

impl Collector for TtlCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let ttl = self.0.borrow().ttl_secs(SystemTime::now()).trunc();
        ConstGauge::new(ttl).encode(encoder.encode_descriptor(
            "kubelet_certificate_manager_client_ttl_seconds",
            "[ALPHA] Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds \
             until certificate expiry (negative if already expired). If client certificate is invalid or unused, \
             the value will be +INF.",
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

    fn manager(dir: &std::path::Path, node: &str) -> (Arc<ClientCertManager>, Registry) {
        let (cert, key) = pair_pem("system:node:n1", -100, 900);
        let mut registry = Registry::default();
        let initial = Pair::parse(&cert, &key, dir).unwrap();
        let manager = ClientCertManager::new(FileStore::new(dir, "kubelet-client", None), node, initial);
        manager.register(&mut registry);
        (manager, registry)
    }

    #[test]
    fn the_deadline_is_the_drawn_share_of_the_lifetime_or_now_for_another_node() {
        let dir = tempfile::tempdir().unwrap();
        let (m, _) = manager(dir.path(), "n1");
        let pair = m.current();
        let life = pair.not_after.duration_since(pair.not_before).unwrap();
        assert_eq!(m.deadline(&pair, 0.7), pair.not_before + life.mul_f64(0.7));
        assert_eq!(m.deadline(&pair, 0.9), pair.not_before + life.mul_f64(0.9));
        let (other, _) = manager(dir.path(), "n2");
        let before = SystemTime::now();
        assert!(other.deadline(&pair, 0.7) >= before && other.deadline(&pair, 0.7) <= SystemTime::now());
        assert!(!other.names_the_node(&pair));
    }

    #[test]
    fn the_ttl_gauge_and_the_error_counter_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let (_m, registry) = manager(dir.path(), "n1");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE kubelet_certificate_manager_client_ttl_seconds gauge"), "{text}");
        let ttl: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("kubelet_certificate_manager_client_ttl_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((800.0..=900.0).contains(&ttl), "{ttl}");
        assert!(text.contains("kubelet_certificate_manager_client_expiration_renew_errors_total 0"), "{text}");
    }
}
