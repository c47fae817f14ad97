//! The HTTPS API's authentication and authorization against the test API server, as a
//! cluster runs them: `TokenReview` and `SubjectAccessReview` over real HTTP through the
//! real `kube` client. The agent itself needs containerd to start, so the server is built
//! in-process from the swiftlet library, from a `KubeletConfiguration` file (v1beta1
//! defaults: webhook authentication and authorization on) and with the test API server's
//! client; no containerd is involved.
//!
//! The matrix: every endpoint × {no credentials, a certificate from another CA, a good
//! certificate whose user is not authorized, a good authorized certificate, an authorized
//! token, an unauthorized token, an unknown token, a token allowed only `nodes/proxy`} ×
//! anonymous access off and on; the status must be upstream's (401, 403, 200, or 404 for
//! paths this server does not serve yet, after authorization as upstream would).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use swiftlet::server::{Endpoints, FakePods, SELF_SIGNED_CERT_FILE, Server, ServerSettings};
use swiftlet_tests::apiserver::{Authorizer, Failure, Options, TestApiServer, UserInfo};
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
    /// rest v1beta1 defaults), the client CA `ca` and `api`'s client.
    async fn start(api: &TestApiServer, ca: &TestCa, config_yaml: &str) -> Result<Self> {
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
        let mut settings = ServerSettings::from_config(&config)?;
        settings.https_addr = Some("127.0.0.1:0".parse()?);
        settings.healthz_addr = None;
        settings.shutdown_grace_period = Duration::from_secs(1);

        let summary = axum::routing::get(|| async { axum::Json(json!({"node": {"nodeName": NODE}})) });
        let endpoints = Endpoints::new(Arc::new(FakePods::default()), Arc::default())
            .metrics_endpoint("/metrics/cadvisor", Arc::default())
            .route("/stats/summary", summary)
            .api_client(api.client().await?);
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

/// The RBAC of the test cluster, as `nodes/<subresource>` rules.
fn cluster_rbac() -> Authorizer {
    Authorizer::node_rules(&[
        ("alice", "*", "*"),
        ("kubelet-api-admins", "*", "*"),
        ("carol", "get", "proxy"),
        ("system:unauthenticated", "get", "healthz"),
        ("system:serviceaccount:monitoring:prometheus", "get", "metrics"),
    ])
}

async fn api_server() -> Result<TestApiServer> {
    let tokens: std::collections::HashMap<String, UserInfo> = [
        ("alice-token", UserInfo::new("alice", &["team-a"])),
        ("bob-token", UserInfo::new("bob", &["team-b"])),
        ("carol-token", UserInfo::new("carol", &[])),
        ("prometheus-token", UserInfo::new("system:serviceaccount:monitoring:prometheus", &["system:serviceaccounts"])),
    ]
    .into_iter()
    .map(|(t, u)| (t.to_owned(), u))
    .collect();
    Ok(TestApiServer::start(Options { tokens, authorizer: cluster_rbac(), ..Options::default() }).await?)
}

fn config_yaml(anonymous: bool) -> String {
    format!(
        "authentication:\n  anonymous:\n    enabled: {anonymous}\n  x509:\n    clientCAFile: CLIENT_CA_FILE\n\
         authorization:\n  webhook:\n    # The default 30s could lapse during the matrix; the TTLs\n    \
         # themselves are unit-tested.\n    cacheUnauthorizedTTL: 10m\n"
    )
}

/// (user, verb, subresource) of a `SubjectAccessReview` body.
fn review_key(review: &Value) -> (String, String, String) {
    let spec = &review["spec"];
    let attrs = &spec["resourceAttributes"];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (s(&spec["user"]), s(&attrs["verb"]), s(&attrs["subresource"]))
}

#[tokio::test]
async fn the_authentication_and_authorization_matrix() -> Result<()> {
    let api = api_server().await?;
    let ca = TestCa::new("cluster-ca");
    let other_ca = TestCa::new("other-ca");
    let identities = [
        (Credentials::CertFromAnotherCa, other_ca.client("mallory", "kubelet-api-admins")),
        (Credentials::CertUnauthorized, ca.client("eve", "nobody")),
        (Credentials::CertAuthorized, ca.client("kube-apiserver-kubelet-client", "kubelet-api-admins")),
    ];
    let token = |c: Credentials| match c {
        Credentials::TokenAuthorized => Some("alice-token"),
        Credentials::TokenUnauthorized => Some("bob-token"),
        Credentials::TokenUnknown => Some("no-such-token"),
        Credentials::TokenProxyOnly => Some("carol-token"),
        _ => None,
    };
    for anonymous in [false, true] {
        api.clear_requests();
        let kubelet = Kubelet::start(&api, &ca, &config_yaml(anonymous)).await?;
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
                    // Upstream's message, naming every subresource asked.
                    let message = serde_json::from_str::<Value>(&body)?["message"].as_str().unwrap_or("").to_owned();
                    let verb = if method == "POST" { "create" } else { "get" };
                    let suffix = format!("verb={verb}, resource=nodes, subresource(s)=[{}])", subresources.join(" "));
                    assert!(message.starts_with("Forbidden (user=") && message.ends_with(&suffix), "{message}");
                }
            }
        }
        assert!(failures.is_empty(), "unexpected statuses:\n{}", failures.join("\n"));

        // The reviews reached the API server: one TokenReview per token (cached, rejected
        // tokens too), as the kubelet sends them (no audiences).
        let token_reviews = api.reviews("tokenreviews");
        let reviewed: BTreeSet<&str> = token_reviews.iter().filter_map(|r| r["spec"]["token"].as_str()).collect();
        assert_eq!(reviewed, BTreeSet::from(["alice-token", "bob-token", "carol-token", "no-such-token"]));
        assert_eq!(token_reviews.len(), 4, "each token reviewed once");
        assert!(token_reviews.iter().all(|r| r["spec"].get("audiences").is_none()));

        // One SubjectAccessReview per (user, verb, subresource), for the node, as nodes/<sub>.
        let reviews = api.reviews("subjectaccessreviews");
        let mut seen: BTreeMap<(String, String, String), usize> = BTreeMap::new();
        for review in &reviews {
            *seen.entry(review_key(review)).or_default() += 1;
            let attrs = &review["spec"]["resourceAttributes"];
            assert_eq!(
                (&attrs["resource"], &attrs["version"], &attrs["name"]),
                (&json!("nodes"), &json!("v1"), &json!(NODE))
            );
        }
        assert!(seen.values().all(|&n| n == 1), "decisions are cached: {seen:?}");
        let key = |u: &str, v: &str, s: &str| (u.to_owned(), v.to_owned(), s.to_owned());
        for want in [
            key("alice", "get", "pods"),
            key("alice", "get", "stats"),
            key("alice", "create", "proxy"),
            key("kube-apiserver-kubelet-client", "get", "metrics"),
            key("eve", "get", "configz"),
            key("eve", "get", "proxy"),
            key("carol", "get", "pods"),
            key("carol", "get", "proxy"),
            key("bob", "get", "log"),
        ] {
            assert!(seen.contains_key(&want), "{want:?} in {seen:?}");
        }
        assert_eq!(seen.contains_key(&key("system:anonymous", "get", "healthz")), anonymous);
        assert!(!seen.keys().any(|(user, _, _)| user == "mallory"), "a bad certificate never reaches authorization");
        let alice = reviews.iter().find(|r| review_key(r) == key("alice", "get", "pods")).unwrap();
        assert_eq!(
            alice["spec"]["groups"],
            json!(["team-a", "system:authenticated"]),
            "the TokenReview's groups, passed on"
        );
        let cert_user = reviews.iter().find(|r| review_key(r).0 == "kube-apiserver-kubelet-client").unwrap();
        assert_eq!(cert_user["spec"]["groups"], json!(["kubelet-api-admins", "system:authenticated"]));
    }
    Ok(())
}

#[tokio::test]
async fn review_failures_are_401_and_500_and_not_cached() -> Result<()> {
    let api = api_server().await?;
    let ca = TestCa::new("cluster-ca");
    let kubelet = Kubelet::start(&api, &ca, &config_yaml(false)).await?;
    let client = kubelet.client(None);
    let get = async |path: &str, token: &str| -> Result<(u16, String)> {
        let response = client.get(kubelet.url(path)).bearer_auth(token).send().await?;
        Ok((response.status().as_u16(), response.text().await?))
    };

    // TokenReview refused (a permanent error): 401, not cached.
    api.fail_requests(Failure::status(403).matching(|r| r.path.ends_with("/tokenreviews")));
    assert_eq!(get("/pods", "alice-token").await?.0, 401);
    api.clear_failures();
    assert_eq!(get("/pods", "alice-token").await?.0, 200);

    // SubjectAccessReview refused: 500 with upstream's message, not cached.
    api.fail_requests(Failure::status(403).matching(|r| r.path.ends_with("/subjectaccessreviews")));
    let (status, body) = get("/configz", "alice-token").await?;
    assert_eq!(status, 500);
    let message = serde_json::from_str::<Value>(&body)?["message"].clone();
    assert_eq!(message, "Authorization error (user=alice, verb=get, resource=nodes, subresource=configz)");
    api.clear_failures();
    assert_eq!(get("/configz", "alice-token").await?.0, 200);

    // A transient failure is retried.
    api.fail_requests(Failure::status(500).times(1).matching(|r| r.path.ends_with("/subjectaccessreviews")));
    assert_eq!(get("/healthz", "alice-token").await?.0, 200);
    let healthz_reviews = api.reviews("subjectaccessreviews").iter().filter(|r| review_key(r).2 == "healthz").count();
    assert_eq!(healthz_reviews, 2, "one failed, one retried");
    Ok(())
}

#[tokio::test]
async fn a_thousand_concurrent_scrapes_make_one_review_each() -> Result<()> {
    let api = api_server().await?;
    let ca = TestCa::new("cluster-ca");
    let kubelet = Kubelet::start(&api, &ca, &config_yaml(false)).await?;
    let client = kubelet.client(None);
    let scrapes: Vec<_> = (0..1000)
        .map(|_| {
            let (client, url) = (client.clone(), kubelet.url("/metrics"));
            tokio::spawn(async move {
                let response = client.get(url).bearer_auth("prometheus-token").send().await?;
                Ok::<_, reqwest::Error>(response.status().as_u16())
            })
        })
        .collect();
    for scrape in scrapes {
        assert_eq!(scrape.await??, 200);
    }
    assert_eq!(api.reviews("tokenreviews").len(), 1, "concurrent requests share one TokenReview");
    assert_eq!(api.reviews("subjectaccessreviews").len(), 1, "and one SubjectAccessReview");
    Ok(())
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
        ServerSettings::from_config(&config)?,
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
