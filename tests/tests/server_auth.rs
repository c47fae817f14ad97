//! The HTTPS API's authentication and authorization against the test bed's real
//! kube-apiserver, as a cluster runs them: `TokenReview` and `SubjectAccessReview` over
//! real HTTP through the real `kube` client, with service-account tokens the API server
//! issued and the cluster's RBAC deciding. The agent itself needs containerd to start,
//! so the server is built in-process from the swiftlet library, from a
//! `KubeletConfiguration` file (v1beta1 defaults: webhook authentication and
//! authorization on); it reviews with a service account allowed to (the rights of
//! `system:auth-delegator`), as a kubelet reviews with its node's.
//!
//! The matrix: every endpoint × {no credentials, a certificate from another CA, a good
//! certificate whose user is not authorized, a good certificate authorized through its
//! group, an authorized token, an unauthorized token, an unknown token, a token allowed
//! only `nodes/proxy`} × anonymous access off and on; the status must be upstream's (401,
//! 403, 200, or 404 for paths this server does not serve yet, after authorization as
//! upstream would). The number of reviews the API server answered (its
//! `apiserver_request_total`) shows the agent's caching: one review per token and per
//! (user, verb, subresource).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use clap::Parser as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use swiftlet::server::{Endpoints, FakePods, SELF_SIGNED_CERT_FILE, Server};
use swiftlet_tests::cluster::Cluster;
use swiftlet_tests::tcp_proxy::TcpProxy;
use swiftlet_tests::testbed_lock;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node-1";

/// A certificate and its key.
struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

/// A CA that signs client certificates.
struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self { pem: cert.pem(), issuer: rcgen::Issuer::new(params, key) }
    }

    fn client(&self, common_name: &str, organization: &str) -> Identity {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        params.distinguished_name.push(rcgen::DnType::OrganizationName, organization);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Identity { cert: cert.der().clone(), key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())) }
    }
}

/// The swiftlet HTTPS API, serving until dropped.
struct Kubelet {
    https: SocketAddr,
    cert_dir: std::path::PathBuf,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Kubelet {
    /// The server of a config file with `authentication`/`authorization` as given (the
    /// rest v1beta1 defaults), the client CA `ca`, reviewing with `client`.
    fn start(client: kube::Client, ca: &TestCa, config_yaml: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca_file = dir.path().join("client-ca.crt");
        std::fs::write(&ca_file, &ca.pem)?;
        let config_file = dir.path().join("config.yaml");
        let config_text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{}",
            config_yaml.replace("CLIENT_CA_FILE", &ca_file.display().to_string())
        );
        std::fs::write(&config_file, config_text)?;
        let cert_dir = dir.path().join("pki");
        let flags = swiftlet::config::Flags::try_parse_from([
            "swiftlet".to_owned(),
            format!("--config={}", config_file.display()),
            format!("--hostname-override={NODE}"),
            format!("--cert-dir={}", cert_dir.display()),
        ])?;
        let config = swiftlet::config::load(flags).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut settings = swiftlet::settings::server(&config)?;
        settings.https_addr = Some("127.0.0.1:0".parse()?);
        settings.healthz_addr = None;
        settings.shutdown_grace_period = Duration::from_secs(1);

        let summary = axum::routing::get(|| async { axum::Json(json!({"node": {"nodeName": NODE}})) });
        let endpoints = Endpoints::new(Arc::new(FakePods::default()), Arc::default())
            .metrics_endpoint("/metrics/cadvisor", Arc::default())
            .route("/stats/summary", summary)
            .api_client(client);
        let server = Server::new(settings, endpoints)?;
        let https = server.https_addr().context("HTTPS API bound")?;
        let shutdown = CancellationToken::new();
        tokio::spawn(server.run(shutdown.clone()));
        Ok(Self { https, cert_dir, shutdown, _dir: dir })
    }

    /// A client that trusts the serving certificate, with a client certificate or none.
    fn client(&self, identity: Option<&Identity>) -> reqwest::Client {
        client_trusting(&self.cert_dir, identity)
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("https://localhost:{}{path_and_query}", self.https.port())
    }
}

fn client_trusting(cert_dir: &Path, identity: Option<&Identity>) -> reqwest::Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(cert_dir.join(SELF_SIGNED_CERT_FILE)).unwrap();
    let cert = rustls::pki_types::pem::PemObject::from_pem_slice(&pem).unwrap();
    roots.add(cert).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(vec![id.cert.clone()], id.key.clone_key()).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder().use_preconfigured_tls(config).build().unwrap()
}

/// The endpoints of the matrix: method, path, the subresources upstream asks for, and
/// whether this server serves it (else 404 once authorized).
const ENDPOINTS: [(&str, &str, &[&str], bool); 11] = [
    ("GET", "/pods", &["pods", "proxy"], true),
    ("GET", "/stats/summary", &["stats"], true),
    ("GET", "/metrics", &["metrics"], true),
    ("GET", "/metrics/cadvisor", &["metrics"], true),
    ("GET", "/configz", &["configz", "proxy"], true),
    ("GET", "/healthz", &["healthz", "proxy"], true),
    ("GET", "/logs/", &["log"], false),
    ("GET", "/containerLogs/default/web/c", &["proxy"], false),
    ("GET", "/exec/default/web/c?command=ls&output=1", &["proxy"], false),
    ("POST", "/run/default/web/c?cmd=ls", &["proxy"], false),
    ("GET", "/spec/", &["proxy"], false),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Credentials {
    None,
    CertFromAnotherCa,
    CertUnauthorized,
    CertAuthorized,
    TokenAuthorized,
    TokenUnauthorized,
    TokenUnknown,
    TokenProxyOnly,
}

const CREDENTIALS: [Credentials; 8] = [
    Credentials::None,
    Credentials::CertFromAnotherCa,
    Credentials::CertUnauthorized,
    Credentials::CertAuthorized,
    Credentials::TokenAuthorized,
    Credentials::TokenUnauthorized,
    Credentials::TokenUnknown,
    Credentials::TokenProxyOnly,
];

/// What upstream answers.
fn expected(credentials: Credentials, anonymous: bool, method: &str, subresources: &[&str], served: bool) -> u16 {
    let ok = if served { 200 } else { 404 };
    match credentials {
        Credentials::CertFromAnotherCa | Credentials::TokenUnknown => 401,
        Credentials::None if !anonymous => 401,
        // system:unauthenticated may get nodes/healthz only.
        Credentials::None if subresources.contains(&"healthz") && method == "GET" => ok,
        Credentials::CertAuthorized | Credentials::TokenAuthorized => ok,
        // get nodes/proxy only: the fine-grained subresources fall back to it, the others
        // (stats, metrics, log) do not; POST is `create`.
        Credentials::TokenProxyOnly if method == "GET" && subresources.last() == Some(&"proxy") => ok,
        Credentials::None
        | Credentials::CertUnauthorized
        | Credentials::TokenUnauthorized
        | Credentials::TokenProxyOnly => 403,
    }
}

/// The label of the cluster-scoped RBAC objects these tests make.
const RBAC_LABEL: &str = "swiftlet.dev/e2e=server-auth";

/// The service accounts of the test namespace: four users, and the one the kubelet
/// reviews with.
const ACCOUNTS: [&str; 5] = ["alice", "bob", "carol", "prometheus", "delegate"];

/// A `ClusterRole` of one rule and its binding to `subjects`.
fn role_and_binding(role: &str, group: &str, resource: &str, verbs: &str, subjects: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: e2e-server-auth-{role}, labels: {{swiftlet.dev/e2e: server-auth}}}}
rules: [{{apiGroups: [\"{group}\"], resources: [\"{resource}\"], verbs: [{verbs}]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: e2e-server-auth-{role}, labels: {{swiftlet.dev/e2e: server-auth}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-server-auth-{role}}}
subjects: {subjects}
---
"
    )
}

/// The test's users and RBAC on the real cluster.
struct Fixture {
    cluster: Cluster,
    ns: String,
    tokens: BTreeMap<&'static str, String>,
}

impl Fixture {
    /// Service accounts with their tokens, and the cluster's RBAC for the kubelet API:
    /// alice and the group `kubelet-api-admins` are bound to `system:kubelet-api-admin`
    /// (everything the kubelet API asks for), carol may
    /// `get nodes/proxy`, prometheus `get nodes/metrics`, the unauthenticated
    /// `get nodes/healthz`; bob nothing. The reviewer's rights come with
    /// [`Fixture::allow_reviews`].
    async fn new() -> Result<Self> {
        let cluster = Cluster::connect().await?;
        // What a failed run left.
        cluster.kubectl_ok(&["delete", "clusterrole,clusterrolebinding", "-l", RBAC_LABEL, "--ignore-not-found"])?;
        let ns = cluster.namespace("server-auth").await?;
        let mut tokens = BTreeMap::new();
        for sa in ACCOUNTS {
            cluster.kubectl_ok(&["-n", &ns, "create", "serviceaccount", sa])?;
            let token = cluster.kubectl_ok(&["-n", &ns, "create", "token", sa, "--duration=1h"])?;
            tokens.insert(sa, token.trim().to_owned());
        }
        let sa = |name: &str| format!("[{{kind: ServiceAccount, name: {name}, namespace: {ns}}}]");
        // The built-in role for the API server's access to kubelets (its fine-grained
        // subresources too).
        let mut yaml = format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: e2e-server-auth-admins, labels: {{swiftlet.dev/e2e: server-auth}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: \"system:kubelet-api-admin\"}}
subjects: [{{kind: ServiceAccount, name: alice, namespace: {ns}}}, {{apiGroup: rbac.authorization.k8s.io, kind: Group, name: kubelet-api-admins}}]
---
"
        );
        yaml += &role_and_binding("proxy", "", "nodes/proxy", "get", &sa("carol"));
        yaml += &role_and_binding("metrics", "", "nodes/metrics", "get", &sa("prometheus"));
        yaml += &role_and_binding(
            "healthz",
            "",
            "nodes/healthz",
            "get",
            "[{apiGroup: rbac.authorization.k8s.io, kind: Group, name: \"system:unauthenticated\"}]",
        );
        cluster.kubectl_apply(&yaml)?;
        Ok(Self { cluster, ns, tokens })
    }

    /// [`Fixture::new`], the reviewing account allowed both reviews.
    async fn reviewing() -> Result<Self> {
        let fx = Self::new().await?;
        fx.allow_reviews(true, true)?;
        Ok(fx)
    }

    /// Lets the reviewing account create `TokenReviews` (`tokens`) and
    /// `SubjectAccessReviews` (`access`).
    fn allow_reviews(&self, tokens: bool, access: bool) -> Result<()> {
        let sa = format!("[{{kind: ServiceAccount, name: delegate, namespace: {}}}]", self.ns);
        let mut yaml = String::new();
        if tokens {
            yaml += &role_and_binding("tokenreviews", "authentication.k8s.io", "tokenreviews", "create", &sa);
        }
        if access {
            yaml += &role_and_binding("sar", "authorization.k8s.io", "subjectaccessreviews", "create", &sa);
        }
        self.cluster.kubectl_apply(&yaml)
    }

    fn token(&self, sa: &str) -> &str {
        self.tokens.get(sa).map_or("", String::as_str)
    }

    fn user(&self, sa: &str) -> String {
        format!("system:serviceaccount:{}:{sa}", self.ns)
    }

    /// The reviewing client, reaching the API server at `server` (its own address, or a
    /// proxy in front of it).
    fn reviewer(&self, server: &str) -> Result<kube::Client> {
        let ca = std::fs::read(&self.cluster.state.ca_cert)?;
        let mut config = kube::Config::new(server.parse()?);
        config.root_cert =
            Some(vec![rustls::pki_types::pem::PemObject::from_pem_slice(&ca).map(|c: CertificateDer<'_>| c.to_vec())?]);
        config.auth_info.token = Some(self.token("delegate").to_owned().into());
        Ok(kube::Client::try_from(config)?)
    }

    /// `TokenReviews` and `SubjectAccessReviews` the API server has answered (any code).
    fn reviews_answered(&self) -> Result<(u64, u64)> {
        let metrics = self.cluster.kubectl_ok(&["get", "--raw", "/metrics"])?;
        let count = |resource: &str| {
            metrics
                .lines()
                .filter(|l| l.starts_with("apiserver_request_total{"))
                .filter(|l| l.contains(&format!("resource=\"{resource}\"")) && l.contains("verb=\"POST\""))
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                .sum::<f64>() as u64
        };
        Ok((count("tokenreviews"), count("subjectaccessreviews")))
    }

    /// Waits until the API server has answered `want` more reviews than `before` (its
    /// counters move once the response is on its way), and no more.
    async fn expect_reviews(&self, before: (u64, u64), want: (u64, u64)) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let now = self.reviews_answered()?;
            let got = (now.0 - before.0, now.1 - before.1);
            ensure!(got.0 <= want.0 && got.1 <= want.1, "(TokenReviews, SubjectAccessReviews) {got:?}, not {want:?}");
            if got == want {
                return Ok(());
            }
            ensure!(std::time::Instant::now() < deadline, "(TokenReviews, SubjectAccessReviews) {got:?}, not {want:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn cleanup(&self) -> Result<()> {
        self.cluster.kubectl_ok(&["delete", "clusterrole,clusterrolebinding", "-l", RBAC_LABEL])?;
        self.cluster.kubectl_ok(&["delete", "namespace", &self.ns, "--wait=false"])?;
        Ok(())
    }
}

fn config_yaml(anonymous: bool) -> String {
    format!(
        "authentication:\n  anonymous:\n    enabled: {anonymous}\n  x509:\n    clientCAFile: CLIENT_CA_FILE\n\
         authorization:\n  webhook:\n    # The default 30s could lapse during the matrix; the TTLs\n    \
         # themselves are unit-tested.\n    cacheUnauthorizedTTL: 10m\n"
    )
}

/// Whether the cluster's RBAC (see [`Fixture::new`]) lets `credentials` do `verb` on
/// `nodes/<subresource>`.
fn allowed(credentials: Credentials, verb: &str, subresource: &str) -> bool {
    match credentials {
        Credentials::CertAuthorized | Credentials::TokenAuthorized => true,
        Credentials::TokenProxyOnly => verb == "get" && subresource == "proxy",
        Credentials::None => verb == "get" && subresource == "healthz",
        _ => false,
    }
}

/// The `SubjectAccessReviews` one matrix pass needs: for each authenticated user, one per
/// (verb, subresource) asked, each endpoint's subresources asked in order until one is
/// allowed; decisions are cached.
fn access_reviews_needed(anonymous: bool) -> u64 {
    let mut asked = BTreeSet::new();
    for credentials in CREDENTIALS {
        let authenticated = match credentials {
            Credentials::CertFromAnotherCa | Credentials::TokenUnknown => false,
            Credentials::None => anonymous,
            _ => true,
        };
        if !authenticated {
            continue;
        }
        for (method, _, subresources, _) in ENDPOINTS {
            let verb = if method == "POST" { "create" } else { "get" };
            for sub in subresources {
                asked.insert((format!("{credentials:?}"), verb, *sub));
                if allowed(credentials, verb, sub) {
                    break;
                }
            }
        }
    }
    asked.len() as u64
}

#[tokio::test]
async fn the_authentication_and_authorization_matrix() -> Result<()> {
    let _g = testbed_lock().await;
    let fx = Fixture::reviewing().await?;
    let ca = TestCa::new("cluster-ca");
    let other_ca = TestCa::new("other-ca");
    let identities = [
        (Credentials::CertFromAnotherCa, other_ca.client("mallory", "kubelet-api-admins")),
        (Credentials::CertUnauthorized, ca.client("eve", "nobody")),
        (Credentials::CertAuthorized, ca.client("kube-apiserver-kubelet-client", "kubelet-api-admins")),
    ];
    let token = |c: Credentials| match c {
        Credentials::TokenAuthorized => Some(fx.token("alice")),
        Credentials::TokenUnauthorized => Some(fx.token("bob")),
        Credentials::TokenUnknown => Some("no-such-token"),
        Credentials::TokenProxyOnly => Some(fx.token("carol")),
        _ => None,
    };
    for anonymous in [false, true] {
        let kubelet = Kubelet::start(fx.reviewer(&fx.cluster.state.server)?, &ca, &config_yaml(anonymous))?;
        let before = fx.reviews_answered()?;
        let mut failures = Vec::new();
        for credentials in CREDENTIALS {
            let identity = identities.iter().find(|(c, _)| *c == credentials).map(|(_, id)| id);
            let client = kubelet.client(identity);
            for (method, path, subresources, served) in ENDPOINTS {
                let mut request = client.request(method.parse()?, kubelet.url(path));
                if let Some(token) = token(credentials) {
                    request = request.bearer_auth(token);
                }
                let response = request.send().await.with_context(|| format!("{credentials:?} {method} {path}"))?;
                let status = response.status().as_u16();
                let body = response.text().await?;
                let want = expected(credentials, anonymous, method, subresources, served);
                if status != want {
                    failures.push(format!("anonymous={anonymous} {credentials:?} {method} {path}: {status} {body}"));
                }
                if status == 403 {
                    // Upstream's message, naming the user and every subresource asked.
                    let message = serde_json::from_str::<Value>(&body)?["message"].as_str().unwrap_or("").to_owned();
                    let verb = if method == "POST" { "create" } else { "get" };
                    let suffix = format!("verb={verb}, resource=nodes, subresource(s)=[{}])", subresources.join(" "));
                    assert!(message.starts_with("Forbidden (user=") && message.ends_with(&suffix), "{message}");
                    if credentials == Credentials::TokenUnauthorized {
                        assert!(message.starts_with(&format!("Forbidden (user={}, ", fx.user("bob"))), "{message}");
                    }
                }
            }
        }
        assert!(failures.is_empty(), "unexpected statuses:\n{}", failures.join("\n"));
        // One TokenReview per good token (cached); the unknown token is reviewed at each
        // request: the API server answers it with `status.error` ("invalid bearer
        // token"), and upstream's delegating authenticator does not cache errors
        // (`cache.New(.., cacheErrs=false, ..)`). One SubjectAccessReview per (user,
        // verb, subresource).
        let token_reviews = 3 + ENDPOINTS.len() as u64;
        fx.expect_reviews(before, (token_reviews, access_reviews_needed(anonymous))).await?;
    }
    fx.cleanup()
}

#[tokio::test]
async fn review_failures_are_401_and_500_and_not_cached() -> Result<()> {
    let _g = testbed_lock().await;
    let fx = Fixture::new().await?;
    let target: std::net::SocketAddr = fx.cluster.state.server.trim_start_matches("https://").parse()?;
    let proxy = TcpProxy::start(target).await?;
    let ca = TestCa::new("cluster-ca");
    let kubelet = Kubelet::start(fx.reviewer(&format!("https://{}", proxy.addr))?, &ca, &config_yaml(false))?;
    let client = kubelet.client(None);
    let get = async |path: &str, token: &str| -> Result<(u16, String)> {
        let response = client.get(kubelet.url(path)).bearer_auth(token).send().await?;
        Ok((response.status().as_u16(), response.text().await?))
    };
    // Until RBAC lets it in, a request answers as `want` (at most 10 s: the API server's
    // authorizer follows RBAC changes within a second or so).
    let eventually = async |path: &str, want: u16| -> Result<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (status, body) = get(path, fx.token("alice")).await?;
            if status == want {
                return Ok(body);
            }
            ensure!(std::time::Instant::now() < deadline, "{path}: {status} {body}, not {want}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };

    // The reviewer may not create TokenReviews (RBAC forbids: a permanent error): 401.
    assert_eq!(get("/pods", fx.token("alice")).await?.0, 401);
    // Allowed TokenReviews but not SubjectAccessReviews: 500 with upstream's message. The
    // 401 was not cached.
    fx.allow_reviews(true, false)?;
    let body = eventually("/configz", 500).await?;
    let message = serde_json::from_str::<Value>(&body)?["message"].clone();
    assert_eq!(
        message,
        format!("Authorization error (user={}, verb=get, resource=nodes, subresource=configz)", fx.user("alice"))
    );
    // Both allowed: the 500 was not cached either.
    fx.allow_reviews(true, true)?;
    eventually("/configz", 200).await?;

    // A transient failure (the API server unreachable) is retried: the first attempt
    // finds the connection refused, the retry gets through.
    let before = fx.reviews_answered()?;
    proxy.cut();
    proxy.refuse(true);
    let refused_before = proxy.refused();
    let alice = fx.token("alice").to_owned();
    let (client2, url) = (kubelet.client(None), kubelet.url("/healthz"));
    let request =
        tokio::spawn(async move { client2.get(url).bearer_auth(alice).send().await.map(|r| r.status().as_u16()) });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while proxy.refused() == refused_before {
        ensure!(std::time::Instant::now() < deadline, "the review never tried to reach the API server");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.refuse(false);
    assert_eq!(request.await??, 200);
    // (The token was reviewed before: only the access review went out, once through.)
    fx.expect_reviews(before, (0, 1)).await?;
    fx.cleanup()
}

#[tokio::test]
async fn a_thousand_concurrent_scrapes_make_one_review_each() -> Result<()> {
    let _g = testbed_lock().await;
    let fx = Fixture::reviewing().await?;
    let ca = TestCa::new("cluster-ca");
    let kubelet = Kubelet::start(fx.reviewer(&fx.cluster.state.server)?, &ca, &config_yaml(false))?;
    let client = kubelet.client(None);
    let before = fx.reviews_answered()?;
    let scrapes: Vec<_> = (0..1000)
        .map(|_| {
            let (client, url, token) = (client.clone(), kubelet.url("/metrics"), fx.token("prometheus").to_owned());
            tokio::spawn(async move {
                let response = client.get(url).bearer_auth(token).send().await?;
                Ok::<_, reqwest::Error>(response.status().as_u16())
            })
        })
        .collect();
    for scrape in scrapes {
        assert_eq!(scrape.await??, 200);
    }
    // Concurrent requests share one TokenReview and one SubjectAccessReview.
    fx.expect_reviews(before, (1, 1)).await?;
    fx.cleanup()
}

#[tokio::test]
async fn standalone_webhook_settings_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let flags = swiftlet::config::Flags::try_parse_from([
        "swiftlet".to_owned(),
        format!("--hostname-override={NODE}"),
        format!("--cert-dir={}", dir.path().display()),
    ])?;
    let config = swiftlet::config::load(flags).map_err(|e| anyhow::anyhow!("{e}"))?;
    let err = Server::new(
        swiftlet::settings::server(&config)?,
        Endpoints::new(Arc::new(FakePods::default()), Arc::default()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("authentication.webhook.enabled: no client provided, cannot use webhook authentication"),
        "{err}"
    );
    assert!(err.contains("authorization.mode: Webhook (the v1beta1 default): no client provided"), "{err}");
    Ok(())
}
