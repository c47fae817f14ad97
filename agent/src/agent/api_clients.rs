//! The agent's clients of the API server: three `kube::Client`s built from one
//! kubeconfig ([`ApiClients`]), their client certificate's rotation, and the
//! [`Reconnector`] that moves them all to new connections when a heartbeat fails.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Error;
use crate::config::{Config, KubeletConfiguration};

/// The agent's clients of the API server, built from one kubeconfig as upstream builds
/// its three (`cmd/kubelet/app/server.go`): pods, pod status, mirror pods, volumes' objects
/// and webhook reviews go through `main`, limited by `kubeAPIQPS` / `kubeAPIBurst`; events
/// through a client of their own limited by `eventRecordQPS` / `eventBurst`, so a burst of
/// events never holds back a status write; node status and the Lease through `heartbeat`,
/// never throttled (a node must not look dead because its pods were busy), whose requests
/// time out after the shorter of `nodeStatusUpdateFrequency` and the lease duration. The
/// node's registration goes through `heartbeat` too (upstream's uses the main client): the
/// node manager does both, and a registration is a handful of requests. The watch on the
/// node goes through `main` (see [`crate::node::watch`]).
#[derive(Clone)]
pub(super) struct ApiClients {
    pub(super) main: kube::Client,
    pub(super) events: kube::Client,
    pub(super) heartbeat: kube::Client,
}

/// What the three clients are built from: the kubeconfig's `kube::Config` and the two
/// token buckets, kept across rebuilds (a rotated certificate keeps the request budget).
#[derive(Clone)]
struct ApiClientsBase {
    path: std::path::PathBuf,
    config: kube::Config,
    main_bucket: Arc<crate::api_throttle::TokenBucket>,
    events_bucket: Arc<crate::api_throttle::TokenBucket>,
    heartbeat_timeout: Option<Duration>,
    /// The Lease renewal interval (a quarter of the lease duration).
    renew_interval: Duration,
}

impl ApiClientsBase {
    async fn load(path: &std::path::Path, kc: &KubeletConfiguration) -> Result<Self, Error> {
        let err = |message: String| Error::Kubeconfig { path: path.display().to_string(), message };
        let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| err(e.to_string()))?;
        let lease = Duration::from_secs(u64::try_from(kc.node_lease_duration_seconds).unwrap_or(0));
        Ok(Self {
            path: path.to_path_buf(),
            config,
            main_bucket: Arc::new(crate::api_throttle::TokenBucket::new(kc.kube_api_qps as f32, kc.kube_api_burst)),
            events_bucket: Arc::new(crate::api_throttle::TokenBucket::new(kc.event_record_qps as f32, kc.event_burst)),
            heartbeat_timeout: Some(kc.node_status_update_frequency.to_std().min(lease)).filter(|t| !t.is_zero()),
            renew_interval: lease / 4,
        })
    }

    /// The three clients, with `pair` as the client certificate when given.
    fn build(&self, pair: Option<&crate::certificate::store::Pair>) -> Result<ApiClients, Error> {
        let err = |message: String| Error::Kubeconfig { path: self.path.display().to_string(), message };
        let mut config = self.config.clone();
        if let Some(pair) = pair {
            use base64::Engine as _;
            let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
            config.auth_info.client_certificate = None;
            config.auth_info.client_key = None;
            config.auth_info.client_certificate_data = Some(b64(&pair.cert_pem));
            config.auth_info.client_key_data = Some(b64(&pair.key_pem).into());
        }
        let client = |config: kube::Config, bucket: Option<&Arc<crate::api_throttle::TokenBucket>>| {
            let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| err(e.to_string()))?;
            Ok::<_, Error>(match bucket {
                Some(bucket) => builder.with_layer(&crate::api_throttle::ThrottleLayer(bucket.clone())).build(),
                None => builder.build(),
            })
        };
        // The heartbeat client's requests time out after the period (upstream's
        // `heartbeatClientConfig.Timeout`), counted from each request. Its sockets' read
        // timeout is longer, counted from each write: a connection idle between two
        // renewals stays in the pool (had it timed out on its own, every renewal would go
        // over a new connection), and a response whose body stalls is still cut. Reusing
        // the connection is what lets a failed renewal show that the network has
        // black-holed the agent's connections (see `Reconnector`), as upstream's
        // heartbeats share the agent's one connection.
        let heartbeat = match self.heartbeat_timeout {
            Some(timeout) => {
                let mut c = config.clone();
                c.read_timeout = Some((timeout * 2).max(self.renew_interval + timeout));
                c.write_timeout = Some(timeout);
                c.reset_reader_on_write = true;
                kube::client::ClientBuilder::try_from(c)
                    .map_err(|e| err(e.to_string()))?
                    .with_layer(&tower::timeout::TimeoutLayer::new(timeout))
                    .build()
            }
            None => client(config.clone(), None)?,
        };
        Ok(ApiClients {
            main: client(config.clone(), Some(&self.main_bucket))?,
            events: client(config, Some(&self.events_bucket))?,
            heartbeat,
        })
    }
}

impl ApiClients {
    #[cfg(test)]
    async fn from_kubeconfig(path: &std::path::Path, kc: &KubeletConfiguration) -> Result<Self, Error> {
        ApiClientsBase::load(path, kc).await?.build(None)
    }
}

/// The agent's connection to the API server (API mode): the clients every component
/// holds, the [`Reconnector`] that gives them new connections when a heartbeat fails, and,
/// with `rotateCertificates`, the rotation of their client certificate.
pub(super) struct Api {
    pub(super) clients: ApiClients,
    pub(super) reconnector: Reconnector,
    pub(super) rotation: Option<ClientCertRotation>,
}

/// `rotateCertificates`: the client certificate manager (its metrics go on `/metrics`)
/// and its task, which the agent spawns.
pub(super) struct ClientCertRotation {
    pub(super) manager: Arc<crate::certificate::rotation::CertManager>,
    /// The rotation, until shutdown; an error when the certificate lapsed for good.
    pub(super) task:
        Box<dyn FnOnce(CancellationToken) -> futures::future::BoxFuture<'static, Result<(), Error>> + Send>,
}

/// The API clients of `--kubeconfig`, after `--bootstrap-kubeconfig` has got a client
/// certificate when one is given; `None` without `--kubeconfig` (standalone).
pub(super) async fn connect(cfg: &Config) -> Result<Option<Api>, Error> {
    let kc = &cfg.kubelet;
    if let (Some(path), Some(bootstrap)) = (&cfg.kubeconfig, &cfg.bootstrap_kubeconfig) {
        crate::certificate::bootstrap::load_client_cert(path, bootstrap, &cfg.cert_dir, &cfg.node_name).await?;
    }
    let Some(path) = &cfg.kubeconfig else { return Ok(None) };
    if kc.rotate_certificates {
        return Api::rotating(path, kc, &cfg.cert_dir, &cfg.node_name).await.map(Some);
    }
    let base = ApiClientsBase::load(path, kc).await?;
    let ns = base.config.default_namespace.clone();
    let (clients, reconnector) = Reconnector::plain(base, &ns)?;
    Ok(Some(Api { clients, reconnector, rotation: None }))
}

impl Api {
    /// The API clients when `rotateCertificates` is on: each is a
    /// [`crate::certificate::rotation::RotatingClient`], rebuilt with every new pair.
    async fn rotating(
        path: &std::path::Path,
        kc: &KubeletConfiguration,
        cert_dir: &std::path::Path,
        node: &str,
    ) -> Result<Self, Error> {
        use crate::certificate::rotation::{CLIENT, CertManager};
        let base = ApiClientsBase::load(path, kc).await?;
        let store = crate::certificate::bootstrap::client_store(
            cert_dir,
            crate::certificate::bootstrap::kubeconfig_cert_files(path),
        );
        // Without a certificate (a token kubeconfig), one is requested at once with the
        // kubeconfig's credentials and used from then on, as upstream.
        let current = match store.current()? {
            Some(pair) => Some(pair),
            None => match crate::certificate::bootstrap::kubeconfig_client_cert(path) {
                Ok(pair) => Some(pair),
                Err(e) => {
                    tracing::info!(reason = %e, "rotateCertificates: no client certificate yet; requesting one");
                    None
                }
            },
        };
        let first = base.build(current.as_ref())?;
        let ns = base.config.default_namespace.clone();
        let manager = CertManager::new(CLIENT, store, node, None, current);
        let (clients, reconnector) = {
            let (base, manager) = (base.clone(), manager.clone());
            Reconnector::over(first, &ns, move || base.build(manager.current().as_deref()))
        };
        let (run_manager, watcher, requester) = (manager.clone(), manager.clone(), clients.main.clone());
        let cells = reconnector.clone();
        let task = Box::new(move |shutdown: CancellationToken| {
            Box::pin(async move {
                let rotation = run_manager.run_applying(requester, shutdown, |pair| match base.build(Some(pair)) {
                    Ok(next) => {
                        cells.swap(next);
                        tracing::info!("the API clients use the new client certificate");
                    }
                    Err(e) => tracing::error!(error = %e, "the new client certificate does not load"),
                });
                let lapsed = watcher.without_valid_certificate_for(
                    crate::certificate::rotation::EXIT_WITHOUT_CERTIFICATE,
                    Duration::from_secs(10),
                );
                tokio::select! {
                    () = rotation => Ok(()),
                    // Upstream's klog.Fatal in its rotating transport: the pods keep
                    // running in the runtime, and the restarted agent bootstraps anew.
                    () = lapsed => Err(Error::CredentialsLapsed(crate::certificate::rotation::EXIT_WITHOUT_CERTIFICATE)),
                }
            }) as futures::future::BoxFuture<'static, Result<(), Error>>
        });
        Ok(Self { clients, reconnector, rotation: Some(ClientCertRotation { manager, task }) })
    }
}

/// The API clients' connections, all dropped at once when a heartbeat fails (upstream's
/// `closeAllConns`): each client is a [`crate::certificate::rotation::RotatingClient`]
/// cell, rebuilt (new connection pools) and swapped. A network that black-holes
/// connections (half-open: nothing moves, nothing closes) would otherwise keep new
/// requests on dead pooled connections until their read timeout, minutes later.
/// Requests under way finish or time out on their old connection; the pod watch starts
/// again on a new one when told through [`Reconnector::generation`].
#[derive(Clone)]
pub(super) struct Reconnector {
    cells: [crate::certificate::rotation::RotatingClient; 3],
    rebuild: Arc<dyn Fn() -> Result<ApiClients, Error> + Send + Sync>,
    pub(super) generation: tokio::sync::watch::Sender<u64>,
}

impl Reconnector {
    /// The least time between two resets: heartbeats retried every 200 ms during an
    /// outage must not rebuild the clients (and relist the pods) each time.
    const MIN_INTERVAL: Duration = Duration::from_secs(5);

    /// The clients every component uses (with `ns` as their default namespace), sending
    /// through `first` until [`Reconnector::swap`]; `rebuild` makes a fresh set for
    /// [`Reconnector::reset`].
    fn over(
        first: ApiClients,
        ns: &str,
        rebuild: impl Fn() -> Result<ApiClients, Error> + Send + Sync + 'static,
    ) -> (ApiClients, Self) {
        use crate::certificate::rotation::RotatingClient;
        let cells =
            [RotatingClient::new(first.main), RotatingClient::new(first.events), RotatingClient::new(first.heartbeat)];
        let clients =
            ApiClients { main: cells[0].client(ns), events: cells[1].client(ns), heartbeat: cells[2].client(ns) };
        (clients, Self { cells, rebuild: Arc::new(rebuild), generation: tokio::sync::watch::Sender::new(0) })
    }

    /// Plain clients made resettable.
    fn plain(base: ApiClientsBase, ns: &str) -> Result<(ApiClients, Self), Error> {
        let first = base.build(None)?;
        Ok(Self::over(first, ns, move || base.build(None)))
    }

    /// Every later request of every clone of the clients goes through `next`.
    fn swap(&self, next: ApiClients) {
        self.cells[0].swap(next.main);
        self.cells[1].swap(next.events);
        self.cells[2].swap(next.heartbeat);
    }

    /// Rebuilds the clients and bumps the generation.
    fn reset(&self) {
        match (self.rebuild)() {
            Ok(next) => {
                self.swap(next);
                self.generation.send_modify(|g| *g += 1);
            }
            Err(e) => tracing::error!(error = %e, "cannot rebuild the API clients"),
        }
    }

    /// Resets on each heartbeat failure, at most every [`Reconnector::MIN_INTERVAL`].
    pub(super) async fn run(self, failed: Arc<tokio::sync::Notify>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = failed.notified() => {}
            }
            tracing::warn!("a heartbeat failed; leaving every connection to the API server for new ones");
            self.reset();
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Self::MIN_INTERVAL) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubeconfig for plain HTTP to 127.0.0.1:`port`, no credentials.
    fn plain_kubeconfig(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
                 clusters: [{{name: t, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
                 users: [{{name: t, user: {{}}}}]\n\
                 contexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n"
            ),
        )
        .unwrap();
        path
    }

    /// The agent's clients, configured by `kc`, of a plain-HTTP server that answers `{}` to
    /// everything (and the folder holding their kubeconfig).
    async fn clients_of_answering_server(kc: &KubeletConfiguration) -> (tempfile::TempDir, ApiClients) {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, axum::Router::new().fallback(|| async { "{}" })).await });
        let path = plain_kubeconfig(dir.path(), port);
        let clients = ApiClients::from_kubeconfig(&path, kc).await.unwrap();
        (dir, clients)
    }

    fn get(client: &kube::Client) -> impl std::future::Future<Output = kube::Result<String>> + 'static {
        let client = client.clone();
        async move { client.request_text(http::Request::get("/api/v1/namespaces").body(Vec::new()).unwrap()).await }
    }

    /// A server that answers one request per connection and then holds it (a black-holed
    /// connection): its port and the count of connections it accepted.
    async fn answer_once_then_hold() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        let Ok(n) = conn.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                    }
                    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
                    // Then nothing moves on this connection, and it stays open.
                    std::future::pending::<()>().await;
                    drop(conn);
                });
            }
        });
        (port, connections)
    }

    /// The heartbeat client keeps its connection between renewals further apart than its
    /// timeout, and a request on it that gets no answer fails after the timeout. Found by
    /// the black-holed-connections e2e test: with the timeout as the sockets' read timeout,
    /// an idle connection timed out on its own, every renewal went over a new connection,
    /// and no renewal ever failed on a black-holed one.
    #[tokio::test]
    async fn heartbeats_reuse_their_idle_connection_and_time_out_on_it() {
        let (port, connections) = answer_once_then_hold().await;
        let dir = tempfile::tempdir().unwrap();
        let kc = KubeletConfiguration {
            node_status_update_frequency: crate::config::GoDuration::from_millis(500),
            node_lease_duration_seconds: 2,
            ..KubeletConfiguration::default()
        };
        let clients = ApiClients::from_kubeconfig(&plain_kubeconfig(dir.path(), port), &kc).await.unwrap();
        get(&clients.heartbeat).await.unwrap();
        // Idle for longer than the timeout, as between two renewals.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let second = tokio::time::timeout(Duration::from_secs(5), get(&clients.heartbeat))
            .await
            .expect("a heartbeat without an answer did not time out");
        assert!(second.is_err(), "answered on a new connection instead of the pooled one: {second:?}");
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// A reset leaves the pooled connections: a server that answers one request per
    /// connection and then holds it (a black-holed connection) stalls the next request
    /// on the pooled connection; after a reset, it goes out on a new one.
    #[tokio::test]
    async fn a_reset_leaves_pooled_connections_for_new_ones() {
        let (port, connections) = answer_once_then_hold().await;
        let dir = tempfile::tempdir().unwrap();
        let path = plain_kubeconfig(dir.path(), port);
        let base = ApiClientsBase::load(&path, &KubeletConfiguration::default()).await.unwrap();
        let (clients, reconnector) = Reconnector::plain(base, "default").unwrap();
        let mut generation = reconnector.generation.subscribe();
        get(&clients.main).await.unwrap();
        let stalled = tokio::time::timeout(Duration::from_millis(500), get(&clients.main)).await;
        assert!(stalled.is_err(), "the pooled connection answered: {stalled:?}");
        reconnector.reset();
        assert!(generation.has_changed().unwrap(), "the pod watch is not told");
        generation.mark_unchanged();
        tokio::time::timeout(Duration::from_secs(5), get(&clients.main)).await.expect("still stalled").unwrap();
        // The copies every component holds use the new pool too.
        tokio::time::timeout(Duration::from_secs(5), get(&clients.events)).await.expect("events stalled").unwrap();
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn events_and_heartbeats_do_not_wait_for_the_pod_clients_tokens() {
        let kc = KubeletConfiguration { kube_api_qps: 1, kube_api_burst: 1, ..KubeletConfiguration::default() };
        let (_dir, clients) = clients_of_answering_server(&kc).await;
        // The pod client spends its one token, then four more requests queue for ~4 s.
        get(&clients.main).await.unwrap();
        let queued: Vec<_> = (0..4).map(|_| tokio::spawn(get(&clients.main))).collect();
        tokio::task::yield_now().await;
        // Events (eventBurst 100) and heartbeats (never throttled) go out at once; had they
        // shared the pod client's bucket, each would wait behind the queue.
        let others = async {
            for _ in 0..5 {
                get(&clients.events).await.unwrap();
                get(&clients.heartbeat).await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(2), others)
            .await
            .expect("events and heartbeats waited for the pod client's tokens");
        assert!(queued.iter().any(|q| !q.is_finished()), "the pod client was not limited to kubeAPIQPS");
        for q in queued {
            q.abort();
        }
    }

    #[tokio::test]
    async fn event_client_is_limited_by_event_record_qps() {
        let kc = KubeletConfiguration { event_record_qps: 1, event_burst: 1, ..KubeletConfiguration::default() };
        let (_dir, clients) = clients_of_answering_server(&kc).await;
        get(&clients.events).await.unwrap();
        let second = tokio::spawn(get(&clients.events));
        // The pod client (kubeAPIQPS 50) is not held back by the events' empty bucket.
        tokio::time::timeout(Duration::from_secs(2), get(&clients.main)).await.unwrap().unwrap();
        assert!(!second.is_finished(), "the second event went out without waiting for a token");
        second.await.unwrap().unwrap();
    }
}
