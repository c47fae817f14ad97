//! Certificate rotation (client-go's certificate manager): the client certificate
//! (`rotateCertificates`) and the serving certificate (`serverTLSBootstrap`), and API
//! clients that follow the current client pair.
//!
//! The serving certificate's names follow the node's addresses as the node status last
//! reported them (upstream's `getLastObservedNodeAddresses`): none is requested before
//! the node has an IP address, and when the addresses change so that the current
//! certificate no longer covers them, a new one is requested at once (a request still
//! pending for the old names is abandoned).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::NodeAddress;
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

/// The names a serving certificate covers for the node's `addresses` (upstream's
/// `addressesToHostnamesAndIPs`): `Hostname` (a DNS name, or an IP when it is one),
/// `InternalDNS`/`ExternalDNS` and `InternalIP`/`ExternalIP`, each once, DNS names first,
/// each kind sorted. Empty when there is no IP address: upstream requests nothing then.
#[must_use]
pub fn serving_names(addresses: &[NodeAddress]) -> Vec<String> {
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    for a in addresses.iter().filter(|a| !a.address.is_empty()) {
        let is_ip = a.address.parse::<std::net::IpAddr>().is_ok();
        match a.type_.as_str() {
            "Hostname" | "InternalIP" | "ExternalIP" if is_ip => ips.push(a.address.clone()),
            "Hostname" | "InternalDNS" | "ExternalDNS" => dns.push(a.address.clone()),
            _ => {}
        }
    }
    if ips.is_empty() {
        return Vec::new();
    }
    for names in [&mut dns, &mut ips] {
        names.sort();
        names.dedup();
    }
    dns.extend(ips);
    dns
}

/// Keeps one of the agent's certificates current: requests it when there is none,
/// rotates it before it expires, and tells subscribers (the API clients, the HTTPS
/// server) of each new pair.
pub struct CertManager {
    kind: Kind,
    store: FileStore,
    node: String,
    /// The node's addresses as last reported, whose names the certificate must cover
    /// (serving); `None`: the node's identity only (client).
    addresses: Option<watch::Receiver<Vec<NodeAddress>>>,
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
    /// A manager of `node`'s `kind` certificate covering the names of `addresses` (see
    /// [`serving_names`]; `None` for the client certificate), starting from `initial`
    /// (none: request one as soon as there is a template), storing new pairs in `store`.
    #[must_use]
    pub fn new(
        kind: Kind,
        store: FileStore,
        node: &str,
        addresses: Option<watch::Receiver<Vec<NodeAddress>>>,
        initial: Option<Pair>,
    ) -> Arc<Self> {
        let (current, _) = watch::channel(initial.map(Arc::new));
        Arc::new(Self {
            kind,
            store,
            node: node.to_owned(),
            addresses,
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

    /// The names a certificate requested now must cover; `None` while there is nothing
    /// to request (a serving certificate before the node has an IP address).
    #[must_use]
    pub fn template(&self) -> Option<Vec<String>> {
        match &self.addresses {
            None => Some(Vec::new()),
            Some(addresses) => Some(serving_names(&addresses.borrow())).filter(|names| !names.is_empty()),
        }
    }

    /// Whether `pair` is what this manager would request: the node's common name in
    /// `system:nodes`, and every name it must cover (client-go's template check; extra
    /// names do not matter, and without a template any pair does).
    #[must_use]
    pub fn satisfies_template(&self, pair: &Pair) -> bool {
        self.template().is_none_or(|names| {
            pair.common_name == node_common_name(&self.node)
                && pair.organizations.iter().any(|o| o == NODES_GROUP)
                && names.iter().all(|n| pair.names.contains(n))
        })
    }

    /// Returns when the node's addresses change so that `done(template)` holds; never
    /// for a manager without addresses.
    async fn template_change(&self, done: impl Fn(Option<Vec<String>>) -> bool) {
        let Some(addresses) = &self.addresses else { return std::future::pending().await };
        let mut addresses = addresses.clone();
        addresses.borrow_and_update();
        loop {
            if addresses.changed().await.is_err() {
                return std::future::pending().await;
            }
            addresses.borrow_and_update();
            if done(self.template()) {
                return;
            }
        }
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

    /// Requests a new key's certificate covering `names` with `client`, stores the pair
    /// and makes it current.
    pub async fn rotate(&self, client: &kube::Client, names: &[String]) -> Result<Arc<Pair>> {
        let key = csr::generate_key()?;
        let request = csr::node_request(&key, &self.node, names)?;
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

    /// Rotates before each certificate's deadline, and whenever the template changes so
    /// that the current pair no longer satisfies it, until `shutdown`.
    pub async fn run(self: Arc<Self>, client: kube::Client, shutdown: CancellationToken) {
        let what = self.kind.what;
        'schedule: loop {
            if self.template().is_none() {
                tracing::info!(certificate = what, "no node IP address yet: waiting for one to request a certificate");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = self.template_change(|t| t.is_some()) => {}
                }
            }
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
            let unsatisfied = self.template_change(|_| pair.as_deref().is_none_or(|p| !self.satisfies_template(p)));
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
                () = unsatisfied => tracing::info!(certificate = what, "the node's addresses changed: rotating"),
            }
            let mut failures = 0usize;
            loop {
                let Some(names) = self.template() else { continue 'schedule };
                // A request for names that are no longer the node's is abandoned.
                let outcome = tokio::select! {
                    outcome = self.rotate(&client, &names) => outcome,
                    () = self.template_change(|t| t.as_ref() != Some(&names)) => {
                        tracing::info!(certificate = what, "the node's addresses changed: requesting anew");
                        continue;
                    }
                };
                match outcome {
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

    fn address(type_: &str, address: &str) -> NodeAddress {
        NodeAddress { type_: type_.into(), address: address.into() }
    }

    fn manager(dir: &std::path::Path, kind: Kind, node: &str) -> (Arc<CertManager>, Registry) {
        let (cert, key) = pair_pem("system:node:n1", -100, 900);
        let mut registry = Registry::default();
        let initial = Pair::parse(&cert, &key, dir).unwrap();
        let manager = CertManager::new(kind, FileStore::new(dir, kind.prefix, None), node, None, Some(initial));
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
        let (m, _) = manager(dir.path(), CLIENT, "n1");
        let pair = m.current().unwrap();
        let life = pair.not_after.duration_since(pair.not_before).unwrap();
        assert_eq!(m.deadline(Some(&pair), 0.7), pair.not_before + life.mul_f64(0.7));
        assert_eq!(m.deadline(Some(&pair), 0.9), pair.not_before + life.mul_f64(0.9));
        let (other, _) = manager(dir.path(), CLIENT, "n2");
        let before = SystemTime::now();
        assert!(other.deadline(Some(&pair), 0.7) >= before && other.deadline(Some(&pair), 0.7) <= SystemTime::now());
        assert!(!other.satisfies_template(&pair));
        assert!(m.deadline(None, 0.7) <= SystemTime::now());
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_certificate_expired_for_the_whole_limit_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let (valid, _) = manager(dir.path(), CLIENT, "n1");
        let limit = Duration::from_mins(5);
        let every = Duration::from_secs(10);
        let waited = tokio::time::timeout(Duration::from_mins(30), valid.without_valid_certificate_for(limit, every));
        assert!(waited.await.is_err(), "a valid certificate never ends the wait");

        let (cert, key) = pair_pem("system:node:n1", -7200, -60);
        let expired = Pair::parse(&cert, &key, dir.path()).unwrap();
        let m = CertManager::new(CLIENT, FileStore::new(dir.path(), "kubelet-client", None), "n1", None, Some(expired));
        let start = tokio::time::Instant::now();
        m.without_valid_certificate_for(limit, every).await;
        let took = start.elapsed();
        assert!(took >= limit && took <= limit + every, "{took:?}");
    }

    #[test]
    fn serving_names_are_upstreams_from_the_addresses() {
        let addresses = [
            address("InternalIP", "10.0.0.5"),
            address("Hostname", "node-b"),
            address("ExternalDNS", "node-b.example.com"),
            address("ExternalIP", "192.0.2.7"),
            address("InternalIP", "10.0.0.5"),
            address("InternalDNS", ""),
            address("InternalIP", "not-an-ip"),
            address("Whatever", "x"),
        ];
        assert_eq!(serving_names(&addresses), ["node-b", "node-b.example.com", "10.0.0.5", "192.0.2.7"]);
        assert_eq!(serving_names(&[address("Hostname", "10.1.1.1")]), ["10.1.1.1"], "an IP hostname is an IP");
        assert!(serving_names(&[address("Hostname", "node-b")]).is_empty(), "no IP: nothing to request");
    }

    #[test]
    fn a_serving_certificate_must_cover_every_name_of_the_current_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair_pem("system:node:n1", -100, 900);
        let pair = Pair::parse(&cert, &key, dir.path()).unwrap();
        let (addresses, rx) = watch::channel(vec![]);
        let m = CertManager::new(SERVING, FileStore::new(dir.path(), "kubelet-server", None), "n1", Some(rx), None);
        assert_eq!(m.template(), None);
        assert!(m.satisfies_template(&pair), "without a template any pair does");
        addresses.send_replace(vec![address("Hostname", "n1"), address("InternalIP", "10.0.0.5")]);
        assert_eq!(m.template().unwrap(), ["n1", "10.0.0.5"]);
        assert!(pair.names.is_empty());
        assert!(!m.satisfies_template(&pair));
        let mut covering = pair.clone();
        covering.names = vec!["n1".into(), "10.0.0.5".into(), "extra".into()];
        assert!(m.satisfies_template(&covering));
        addresses.send_replace(vec![address("Hostname", "n1"), address("InternalIP", "10.0.0.6")]);
        assert!(!m.satisfies_template(&covering), "the node's IP changed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_template_change_wakes_only_when_it_matters() {
        let dir = tempfile::tempdir().unwrap();
        let (addresses, rx) = watch::channel(vec![address("Hostname", "n1")]);
        let m = CertManager::new(SERVING, FileStore::new(dir.path(), "kubelet-server", None), "n1", Some(rx), None);
        let with_ip = m.template_change(|t| t.is_some());
        tokio::pin!(with_ip);
        addresses.send_replace(vec![address("Hostname", "n2")]);
        assert!(tokio::time::timeout(Duration::from_secs(1), &mut with_ip).await.is_err(), "still no IP");
        addresses.send_replace(vec![address("Hostname", "n1"), address("InternalIP", "10.0.0.5")]);
        tokio::time::timeout(Duration::from_secs(1), with_ip).await.expect("an IP came");
        // The client manager has no addresses: it never wakes.
        let (client, _) = manager(dir.path(), CLIENT, "n1");
        assert!(tokio::time::timeout(Duration::from_mins(1), client.template_change(|_| true)).await.is_err());
    }

    #[test]
    fn the_client_metrics_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let (_m, registry) = manager(dir.path(), CLIENT, "n1");
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
        let m = CertManager::new(SERVING, FileStore::new(dir.path(), "kubelet-server", None), "n1", None, None);
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
