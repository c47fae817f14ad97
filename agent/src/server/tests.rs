//! Tests over real sockets on 127.0.0.1 (ephemeral ports): healthz, authentication,
//! client certificates, the routes, `/metrics` through promtool, the self-signed
//! certificate and the reloading of configured files, the read-only port, the limits, and
//! the settings refused at start. (Webhook authentication and authorization against a
//! real HTTP API server: `tests/tests/server_auth.rs`.)

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use clap::Parser as _;
use k8s_openapi::api::core::v1::Pod;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;

use super::*;

/// Settings that serve: both listeners on ephemeral ports, no webhooks.
fn settings(cert_dir: &Path) -> ServerSettings {
    ServerSettings {
        https_addr: Some("127.0.0.1:0".parse().unwrap()),
        read_only_addr: None,
        healthz_addr: Some("127.0.0.1:0".parse().unwrap()),
        tls: TlsSettings {
            cert_and_key: None,
            cert_dir: cert_dir.to_owned(),
            names: vec!["node-1".to_owned()],
            client_ca_file: None,
            cipher_suites: Vec::new(),
            min_version: String::new(),
            bootstrap: None,
        },
        node_name: "node-1".to_owned(),
        anonymous_auth: false,
        webhook_authentication: false,
        token_cache_ttl: Duration::from_mins(2),
        authorization_mode: AUTHORIZATION_MODE_ALWAYS_ALLOW.to_owned(),
        authorized_ttl: Duration::from_mins(5),
        unauthorized_ttl: Duration::from_secs(30),
        configz: serde_json::json!({"kubeletconfig": {"maxPods": 110}}),
        limits: Limits::default(),
        shutdown_grace_period: Duration::from_secs(1),
    }
}

fn sample_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "1dda9ba7"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}
    }))
    .unwrap()
}

fn endpoints() -> Endpoints {
    Endpoints::new(Arc::new(FakePods::new(vec![sample_pod()])), Arc::new(Registry::default()))
}

/// A running server and how to reach and stop it.
struct Running {
    https: SocketAddr,
    healthz: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<()>>,
}

impl Running {
    fn start(settings: ServerSettings, endpoints: Endpoints) -> Self {
        let server = Server::new(settings, endpoints).expect("server starts");
        let https = server.https_addr().unwrap();
        let healthz = server.healthz_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(shutdown.clone()));
        Self { https, healthz, shutdown, task }
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.https.port())
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("run returns after shutdown")
            .unwrap();
        result.expect("run ends cleanly");
    }
}

/// A client that trusts the server's certificate in `cert_dir`, optionally presenting a
/// client certificate.
fn client(cert_dir: &Path, identity: Option<&Identity>) -> reqwest::Client {
    let config = tls_client_config(cert_dir, identity, &[&rustls::version::TLS12, &rustls::version::TLS13]);
    reqwest::Client::builder().use_preconfigured_tls(config).build().unwrap()
}

/// The rustls side of [`client`], for these protocol versions.
fn tls_client_config(
    cert_dir: &Path,
    identity: Option<&Identity>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in tls::read_certs(&cert_dir.join(SELF_SIGNED_CERT_FILE)).unwrap() {
        roots.add(cert).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(vec![id.cert.clone()], id.key.clone_key()).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// A certificate and its key.
struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

/// A test CA that signs client certificates.
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

async fn get(client: &reqwest::Client, url: &str) -> (StatusCode, String, String) {
    let response = client.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e:?}"));
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let content_type =
        response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (status, content_type, response.text().await.unwrap())
}

#[tokio::test]
async fn healthz_lists_checks_like_the_apiserver() {
    let dir = tempfile::tempdir().unwrap();
    let pleg = Arc::new(FakeHealthCheck::new("pleg"));
    let server = Running::start(settings(dir.path()), endpoints().health_check(pleg.clone()));
    let plain = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", server.healthz);

    let (status, content_type, body) = get(&plain, &url("/healthz")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    assert_eq!(content_type, "text/plain; charset=utf-8");
    let (status, _, body) = get(&plain, &url("/healthz?verbose")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "[+]ping ok\n[+]pleg ok\nhealthz check passed\n");

    pleg.set_failing("pleg was last seen active 3m0s ago; threshold is 3m0s");
    let (status, _, body) = get(&plain, &url("/healthz")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body,
        "[+]ping ok\n[-]pleg failed: pleg was last seen active 3m0s ago; threshold is 3m0s\n\
         healthz check failed\n"
    );
    let (status, _, body) = get(&plain, &url("/healthz/pleg")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.starts_with("internal server error: pleg was last seen"), "{body}");
    let (status, _, body) = get(&plain, &url("/healthz/ping")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let (status, _, _) = get(&plain, &url("/healthz/nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = get(&plain, &url("/pods")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the healthz port serves only healthz");

    pleg.set_healthy();
    let (status, _, _) = get(&plain, &url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn without_anonymous_auth_requests_are_unauthorized() {
    let dir = tempfile::tempdir().unwrap();
    let server = Running::start(settings(dir.path()), endpoints());
    let client = client(dir.path(), None);
    for path in ["/pods", "/healthz", "/metrics", "/configz", "/no/such/path"] {
        let (status, content_type, body) = get(&client, &server.url(path)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(content_type, "application/json");
        let status_body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status_body["kind"], "Status");
        assert_eq!(status_body["reason"], "Unauthorized");
        assert_eq!(status_body["code"], 401);
    }
    server.stop().await;
}

#[tokio::test]
async fn anonymous_requests_get_the_pod_list_and_the_other_routes() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let server = Running::start(settings, endpoints());
    let client = client(dir.path(), None);

    let (status, content_type, body) = get(&client, &server.url("/pods")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "application/json");
    assert!(body.starts_with(r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#), "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "web");
    assert_eq!(list["items"][0]["status"]["phase"], "Running");

    let (status, _, body) = get(&client, &server.url("/configz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["kubeletconfig"]["maxPods"], 110);
    let (status, _, body) = get(&client, &server.url("/healthz")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let (status, _, body) = get(&client, &server.url("/no/such/path")).await;
    assert_eq!((status, body.as_str()), (StatusCode::NOT_FOUND, "404 page not found\n"));

    let response = client.get(server.url("/pods")).bearer_auth("some-token").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 401, "tokens need webhook authentication");
    server.stop().await;
}

#[tokio::test]
async fn the_routers_answer_in_process_with_their_filters() {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.read_only_addr = Some("127.0.0.1:0".parse().unwrap());
    let routers = Server::new(settings, endpoints()).unwrap().into_routers();
    let call = |router: &Router, path: &str| {
        let request = http::Request::get(path).body(axum::body::Body::empty()).unwrap();
        let response = router.clone().oneshot(request);
        async move {
            let response = response.await.unwrap();
            let status = response.status();
            (status, response.into_body().collect().await.unwrap().to_bytes())
        }
    };
    let https = routers.https.unwrap();
    // No client certificate in process and anonymous access is off: authentication runs.
    assert_eq!(call(&https, "/pods").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(call(&https, "/a/../pods").await.0, StatusCode::BAD_REQUEST, "the guard runs first");
    let read_only = routers.read_only.unwrap();
    assert_eq!(call(&read_only, "/pods").await.0, StatusCode::OK);
    assert_eq!(call(&read_only, "/configz").await.0, StatusCode::NOT_FOUND);
    assert_eq!(call(&read_only, "/exec/ns/pod/c").await.0, StatusCode::METHOD_NOT_ALLOWED);
    let (status, body) = call(&routers.healthz.unwrap(), "/healthz").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
}

#[tokio::test]
async fn client_certificates_are_verified_against_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test-ca");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let cert_dir = dir.path().join("pki");
    let mut settings = settings(&cert_dir);
    settings.tls.client_ca_file = Some(ca_file);
    let authorizer = Arc::new(FakeAuthorizer::new(Decision::Allow));
    let server = Running::start(settings, endpoints().authorizer(authorizer.clone()));

    // (rcgen keeps one value per attribute type, so one O here.)
    let alice = ca.client("alice", "system:masters");
    let (status, _, _) = get(&client(&cert_dir, Some(&alice)), &server.url("/pods")).await;
    assert_eq!(status, StatusCode::OK);
    let seen = authorizer.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].user.name, "alice");
    assert_eq!(seen[0].user.groups, ["system:masters", "system:authenticated"]);
    assert_eq!((seen[0].verb.as_str(), seen[0].subresource.as_str()), ("get", "pods"));
    assert_eq!(seen[0].name, "node-1");

    // No certificate: the handshake succeeds and authentication says no (anonymous is off).
    let (status, _, _) = get(&client(&cert_dir, None), &server.url("/pods")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A certificate from another CA never authenticates: 401, as upstream (the handshake
    // succeeds; authentication checks the chain).
    let mallory = TestCa::new("other-ca").client("mallory", "system:masters");
    let (status, _, _) = get(&client(&cert_dir, Some(&mallory)), &server.url("/pods")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(authorizer.seen().len(), 1, "mallory never reached authorization");
    server.stop().await;
}

/// A DER TLV.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(u8::try_from(len).unwrap());
    } else {
        let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        out.push(0x80 | u8::try_from(bytes.len()).unwrap());
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// An X.509 v1 certificate (no version field, no extensions: what `openssl x509 -req`
/// makes without an extension file) for `common_name` in `organization`, valid from
/// `from` to `to` (seconds from now), naming `issuer_name` (a DER Name) as its issuer and
/// signed with `signer` (ECDSA P-256, SHA-256).
fn v1_certificate(
    issuer_name: &[u8],
    signer: &rcgen::KeyPair,
    common_name: &str,
    organization: &str,
    from: i64,
    to: i64,
) -> Identity {
    use rcgen::{PublicKeyData as _, SigningKey as _};
    let ecdsa_sha256 = der(0x30, &der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]));
    let time = |secs: i64| {
        let t = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(secs);
        der(0x17, t.strftime("%y%m%d%H%M%SZ").to_string().as_bytes())
    };
    let attribute =
        |oid: &[u8], value: &str| der(0x31, &der(0x30, &[der(0x06, oid), der(0x0c, value.as_bytes())].concat()));
    let subject = der(
        0x30,
        &[attribute(&[0x55, 0x04, 0x0a], organization), attribute(&[0x55, 0x04, 0x03], common_name)].concat(),
    );
    let key = rcgen::KeyPair::generate().unwrap();
    let tbs = der(
        0x30,
        &[
            der(0x02, &[0x2a]),
            ecdsa_sha256.clone(),
            issuer_name.to_vec(),
            der(0x30, &[time(from), time(to)].concat()),
            subject,
            key.subject_public_key_info(),
        ]
        .concat(),
    );
    let signature = signer.sign(&tbs).unwrap();
    let cert = der(0x30, &[tbs, ecdsa_sha256, der(0x03, &[&[0u8][..], &signature].concat())].concat());
    Identity {
        cert: CertificateDer::from(cert),
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}

/// Presents a certificate as it is: rustls' own client refuses to load a v1 certificate
/// (it parses it to compare keys), which Go's and openssl's clients send.
#[derive(Debug)]
struct PresentAsIs(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for PresentAsIs {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn client_presenting(
    cert_dir: &Path,
    identity: &Identity,
    version: &'static rustls::SupportedProtocolVersion,
) -> reqwest::Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in tls::read_certs(&cert_dir.join(SELF_SIGNED_CERT_FILE)).unwrap() {
        roots.add(cert).unwrap();
    }
    let key = provider.key_provider.load_private_key(identity.key.clone_key()).unwrap();
    let certified = rustls::sign::CertifiedKey::new(vec![identity.cert.clone()], key);
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(PresentAsIs(Arc::new(certified))));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder().use_preconfigured_tls(config).build().unwrap()
}

/// An X.509 v1 client certificate signed by the client CA authenticates over TLS 1.2 and
/// 1.3, as upstream's (Go's) verifier accepts it; the chain is still checked: one signed
/// by another key under the client CA's name, one from another CA and an expired one get
/// 401, and never reach authorization.
#[tokio::test]
async fn a_v1_client_certificate_signed_by_the_client_ca_authenticates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test-ca");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let cert_dir = dir.path().join("pki");
    let mut settings = settings(&cert_dir);
    settings.tls.client_ca_file = Some(ca_file);
    let authorizer = Arc::new(FakeAuthorizer::new(Decision::Allow));
    let server = Running::start(settings, endpoints().authorizer(authorizer.clone()));
    let ca_name = {
        let der = tls::read_certs(&dir.path().join("ca.crt")).unwrap().remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        parsed.subject().as_raw().to_vec()
    };
    let alice = v1_certificate(&ca_name, ca.issuer.key(), "alice", "system:masters", -60, 3600);
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let (status, _, _) = get(&client_presenting(&cert_dir, &alice, version), &server.url("/pods")).await;
        assert_eq!(status, StatusCode::OK, "{version:?}");
    }
    let seen = authorizer.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].user.name, "alice");
    assert_eq!(seen[0].user.groups, ["system:masters", "system:authenticated"]);

    let impostor = rcgen::KeyPair::generate().unwrap();
    let forged = v1_certificate(&ca_name, &impostor, "mallory", "system:masters", -60, 3600);
    let other = TestCa::new("other-ca");
    let other_name = {
        let (_, parsed) = x509_parser::pem::parse_x509_pem(other.pem.as_bytes()).unwrap();
        parsed.parse_x509().unwrap().subject().as_raw().to_vec()
    };
    let foreign = v1_certificate(&other_name, other.issuer.key(), "mallory", "system:masters", -60, 3600);
    let expired = v1_certificate(&ca_name, ca.issuer.key(), "alice", "system:masters", -7200, -3600);
    for (what, identity) in [("forged", &forged), ("another CA's", &foreign), ("expired", &expired)] {
        let (status, _, _) =
            get(&client_presenting(&cert_dir, identity, &rustls::version::TLS13), &server.url("/pods")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
    }
    assert_eq!(authorizer.seen().len(), 2, "no bad certificate reached authorization");
    server.stop().await;
}

#[tokio::test]
async fn a_bad_certificate_fails_even_with_anonymous_access() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test-ca");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let cert_dir = dir.path().join("pki");
    let mut settings = settings(&cert_dir);
    settings.tls.client_ca_file = Some(ca_file);
    settings.anonymous_auth = true;
    let server = Running::start(settings, endpoints());
    let mallory = TestCa::new("other-ca").client("mallory", "system:masters");
    let (status, _, _) = get(&client(&cert_dir, Some(&mallory)), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "not anonymous: upstream's union authenticator fails on error");
    let (status, _, _) = get(&client(&cert_dir, None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK, "no certificate at all is anonymous");
    // A certificate with an empty CN is no identity, and no error either: anonymous.
    let nameless = ca.client("", "system:masters");
    let (status, _, _) = get(&client(&cert_dir, Some(&nameless)), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn denied_requests_are_forbidden() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let deny = Arc::new(FakeAuthorizer::new(Decision::Deny("no".to_owned())));
    let server = Running::start(settings, endpoints().authorizer(deny));
    let (status, _, body) = get(&client(dir.path(), None), &server.url("/metrics")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["message"],
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[metrics])"
    );
    let (status, _, body) = get(&client(dir.path(), None), &server.url("/pods")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["message"],
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])"
    );
    server.stop().await;
}

#[tokio::test]
async fn fine_grained_subresources_fall_back_to_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    // Only nodes/proxy is granted, as to clients from before fine-grained authorization.
    let proxy_only = Arc::new(FakeAuthorizer::from_fn(|a| {
        Ok(if a.subresource == "proxy" { Decision::Allow } else { Decision::Deny("not granted".into()) })
    }));
    let summary = axum::routing::get(|| async { "{}" });
    let server = Running::start(settings, endpoints().authorizer(proxy_only.clone()).route("/stats/summary", summary));
    let client = client(dir.path(), None);
    for (path, want) in [
        ("/pods", StatusCode::OK),
        ("/healthz", StatusCode::OK),
        ("/configz", StatusCode::OK),
        ("/stats/summary", StatusCode::FORBIDDEN),
        ("/metrics", StatusCode::FORBIDDEN),
        ("/spec/", StatusCode::NOT_FOUND),
    ] {
        let (status, _, _) = get(&client, &server.url(path)).await;
        assert_eq!(status, want, "{path}");
    }
    let asked: Vec<(String, String)> = proxy_only.seen().into_iter().map(|a| (a.path, a.subresource)).collect();
    let asked: Vec<(&str, &str)> = asked.iter().map(|(p, s)| (p.as_str(), s.as_str())).collect();
    assert_eq!(
        asked,
        [
            ("/pods", "pods"),
            ("/pods", "proxy"),
            ("/healthz", "healthz"),
            ("/healthz", "proxy"),
            ("/configz", "configz"),
            ("/configz", "proxy"),
            ("/stats/summary", "stats"),
            ("/metrics", "metrics"),
            ("/spec/", "proxy"),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn authorizer_errors_are_500s() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let broken = Arc::new(FakeAuthorizer::from_fn(|_| {
        Err(ReviewError::Timeout { review: "SubjectAccessReview", timeout: Duration::from_secs(10) })
    }));
    let server = Running::start(settings, endpoints().authorizer(broken));
    let (status, _, body) = get(&client(dir.path(), None), &server.url("/pods")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["message"],
        "Authorization error (user=system:anonymous, verb=get, resource=nodes, subresource=pods)"
    );
    server.stop().await;
}

#[tokio::test]
async fn bearer_tokens_authenticate_through_the_token_authenticator() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let tokens = Arc::new(FakeTokenAuthenticator::default());
    tokens.add("good-token", UserInfo { name: "alice".into(), groups: vec!["team-a".into()], ..UserInfo::default() });
    let authorizer = Arc::new(FakeAuthorizer::new(Decision::Allow));
    let route = axum::routing::get(|axum::Extension(user): axum::Extension<UserInfo>| async move {
        format!("{} {:?}", user.name, user.groups)
    });
    let server = Running::start(
        settings,
        endpoints().token_authenticator(tokens.clone()).authorizer(authorizer.clone()).route("/stats/summary", route),
    );
    let client = client(dir.path(), None);
    let response = client.get(server.url("/stats/summary")).bearer_auth("good-token").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.text().await.unwrap(), r#"alice ["team-a", "system:authenticated"]"#);
    // A rejected token is 401 although anonymous access is on (upstream: FailOnError).
    let response = client.get(server.url("/stats/summary")).bearer_auth("bad-token").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(tokens.calls(), 2);
    assert_eq!(authorizer.seen().len(), 1, "the rejected token never reached authorization");
    server.stop().await;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct OperationLabels {
    operation_type: String,
}

#[tokio::test]
async fn metrics_are_prometheus_text_that_promtool_accepts() {
    let mut registry = Registry::default();
    let operations = Family::<OperationLabels, Counter>::default();
    registry.register(
        "kubelet_runtime_operations",
        "Cumulative number of runtime operations by operation type",
        operations.clone(),
    );
    operations.get_or_create(&OperationLabels { operation_type: "list_containers".into() }).inc_by(3);
    let running = Gauge::<i64>::default();
    registry.register("kubelet_running_pods", "Number of pods that have a running pod sandbox", running.clone());
    running.set(2);
    let latency = Histogram::new([0.005, 0.01, 0.1, 1.0]);
    registry.register(
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
        latency.clone(),
    );
    latency.observe(0.02);

    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let server = Running::start(
        settings,
        Endpoints::new(Arc::new(FakePods::default()), Arc::new(registry))
            .metrics_endpoint("/metrics/probes", Arc::new(Registry::default())),
    );
    let client = client(dir.path(), None);
    let (status, content_type, body) = get(&client, &server.url("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert!(body.contains("kubelet_runtime_operations_total{operation_type=\"list_containers\"} 3\n"), "{body}");
    assert!(body.contains("# TYPE kubelet_pod_start_duration_seconds histogram\n"), "{body}");
    assert!(body.contains("kubelet_running_pods 2\n"), "{body}");
    assert!(!body.contains("# EOF"), "no OpenMetrics terminator on 0.0.4:\n{body}");
    let (status, _, _) = get(&client, &server.url("/metrics/probes")).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;

    // promtool comes with the prometheus package the test command installs.
    let promtool = Path::new("/usr/bin/promtool");
    assert!(promtool.exists(), "promtool is missing: `cargo xtask test` installs the prometheus package");
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics failed:\n{}{}\n--- body ---\n{body}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// GETs `url` with request headers; returns the status, the response headers and the raw
/// body (not decompressed).
async fn get_with(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let mut request = client.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("GET {url}: {e:?}"));
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let headers = response.headers().clone();
    (status, headers, response.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn metrics_negotiate_openmetrics_and_gzip() {
    let mut registry = Registry::default();
    let operations = Family::<OperationLabels, Counter>::default();
    registry.register("kubelet_runtime_operations", "Cumulative number of runtime operations", operations.clone());
    operations.get_or_create(&OperationLabels { operation_type: "version".into() }).inc();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let server = Running::start(
        settings,
        Endpoints::new(Arc::new(FakePods::default()), Arc::new(registry))
            .metrics_endpoint("/metrics/probes", Arc::new(Registry::default())),
    );
    let client = client(dir.path(), None);
    let content_type = |headers: &reqwest::header::HeaderMap| headers["content-type"].to_str().unwrap().to_owned();
    let url = server.url("/metrics");

    // Prometheus' own Accept header: OpenMetrics 1.0.0, ending in # EOF.
    let prometheus_accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;\
                             q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (status, headers, body) = get_with(&client, &url, &[("accept", prometheus_accept)]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "application/openmetrics-text; version=1.0.0; charset=utf-8");
    assert!(headers.get("content-encoding").is_none());
    let open = String::from_utf8(body).unwrap();
    assert!(open.contains("kubelet_runtime_operations_total{operation_type=\"version\"} 1\n"), "{open}");
    assert!(open.ends_with("# EOF\n"), "{open}");

    // No Accept, or text/plain: Prometheus text 0.0.4.
    for accept in [None, Some("text/plain;version=0.0.4")] {
        let headers_in: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let (status, headers, body) = get_with(&client, &url, &headers_in).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type(&headers), "text/plain; version=0.0.4; charset=utf-8", "{accept:?}");
        assert!(!String::from_utf8(body).unwrap().contains("# EOF"));
    }

    // gzip round trip, in both formats and on the other endpoints too.
    for (accept, want_type, eof) in [
        ("text/plain", "text/plain; version=0.0.4; charset=utf-8", false),
        (
            "application/openmetrics-text; version=1.0.0",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            true,
        ),
    ] {
        let (status, headers, body) = get_with(&client, &url, &[("accept", accept), ("accept-encoding", "gzip")]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type(&headers), want_type);
        assert_eq!(headers["content-encoding"], "gzip");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(body.as_slice()), &mut text).unwrap();
        assert!(text.contains("kubelet_runtime_operations_total{operation_type=\"version\"} 1\n"), "{text}");
        assert_eq!(text.ends_with("# EOF\n"), eof, "{text}");
    }
    let (status, headers, body) =
        get_with(&client, &server.url("/metrics/probes"), &[("accept-encoding", "gzip, deflate")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(&body[..2], &[0x1f, 0x8b], "a gzip stream");
    // gzip;q=0 means "not gzip".
    let (_, headers, _) = get_with(&client, &url, &[("accept-encoding", "gzip;q=0")]).await;
    assert!(headers.get("content-encoding").is_none());
    server.stop().await;
}

#[tokio::test]
async fn the_self_signed_certificate_is_written_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    let cert_path = cert_dir.join(SELF_SIGNED_CERT_FILE);
    let key_path = cert_dir.join(SELF_SIGNED_KEY_FILE);

    let first = Server::new(settings(&cert_dir), endpoints()).unwrap();
    drop(first);
    let cert = std::fs::read(&cert_path).unwrap();
    let key = std::fs::read(&key_path).unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the key is private");
    }
    let der = tls::read_certs(&cert_path).unwrap();
    let (_, parsed) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
    assert_eq!(tls::subject_alt_names(&parsed), ["node-1", "localhost", "127.0.0.1", "::1"]);
    assert!(parsed.subject().to_string().starts_with("CN=node-1@"), "{}", parsed.subject());

    // A second start reuses the pair, and it serves (localhost verifies against it).
    let mut second_settings = settings(&cert_dir);
    second_settings.anonymous_auth = true;
    let second = Running::start(second_settings, endpoints());
    assert_eq!(std::fs::read(&cert_path).unwrap(), cert);
    assert_eq!(std::fs::read(&key_path).unwrap(), key);
    let (status, _, _) = get(&client(&cert_dir, None), &second.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    second.stop().await;

    // A new node name is not covered: the pair is regenerated.
    let mut renamed = settings(&cert_dir);
    renamed.tls.names = vec!["node-2".to_owned()];
    drop(Server::new(renamed, endpoints()).unwrap());
    assert_ne!(std::fs::read(&cert_path).unwrap(), cert);

    // Garbage in the files is replaced, not fatal.
    std::fs::write(&cert_path, "not a certificate").unwrap();
    drop(Server::new(settings(&cert_dir), endpoints()).unwrap());
    assert!(tls::read_certs(&cert_path).is_ok());
}

#[tokio::test]
async fn configured_certificate_files_are_used() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap().self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.path().join("serving.crt"), dir.path().join("serving.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    // The client trusts the configured certificate under the self-signed file name.
    let trust_dir = dir.path().join("trust");
    std::fs::create_dir(&trust_dir).unwrap();
    std::fs::write(trust_dir.join(SELF_SIGNED_CERT_FILE), cert.pem()).unwrap();

    let cert_dir = dir.path().join("pki");
    let mut settings = settings(&cert_dir);
    settings.anonymous_auth = true;
    settings.tls.cert_and_key = Some((cert_file, key_file));
    let server = Running::start(settings, endpoints());
    let (status, _, _) = get(&client(&trust_dir, None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!cert_dir.exists(), "nothing is generated when files are configured");
    server.stop().await;
}

#[test]
fn webhook_settings_need_an_api_client() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    // The v1beta1 defaults, standalone.
    settings.webhook_authentication = true;
    settings.authorization_mode = AUTHORIZATION_MODE_WEBHOOK.to_owned();
    let err = Server::new(settings, endpoints()).unwrap_err();
    let text = err.to_string();
    for want in [
        "authentication.webhook.enabled: no client provided, cannot use webhook authentication",
        "must set authentication.webhook.enabled: false",
        "authorization.mode: Webhook (the v1beta1 default): no client provided, cannot use webhook authorization",
        "must set authorization.mode: AlwaysAllow",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    assert!(matches!(err, Error::Settings { ref problems } if problems.len() == 2));
    assert!(!dir.path().join(SELF_SIGNED_CERT_FILE).exists(), "refused before any file is written");

    let mut settings = self::settings(dir.path());
    settings.authorization_mode = "RBAC".to_owned();
    let err = Server::new(settings, endpoints()).unwrap_err();
    assert!(err.to_string().contains("authorization.mode: unsupported value \"RBAC\""), "{err}");
}

#[tokio::test]
async fn webhook_settings_are_served_with_an_api_client() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.webhook_authentication = true;
    settings.authorization_mode = AUTHORIZATION_MODE_WEBHOOK.to_owned();
    // The client connects lazily: nothing needs to listen there for the server to start.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    assert!(Server::new(settings, endpoints().api_client(client)).is_ok());
}

#[test]
fn settings_from_a_default_config_are_refused_standalone() {
    let dir = tempfile::tempdir().unwrap();
    let flags = crate::config::Flags::try_parse_from([
        "swiftlet",
        "--hostname-override=node-1",
        &format!("--cert-dir={}", dir.path().display()),
    ])
    .unwrap();
    let mut config = crate::config::load(flags).unwrap();
    let settings = crate::settings::server(&config).unwrap();
    assert_eq!(settings.https_addr, Some("0.0.0.0:10250".parse().unwrap()));
    assert_eq!(settings.healthz_addr, Some("127.0.0.1:10248".parse().unwrap()));
    assert_eq!(settings.read_only_addr, None);
    assert_eq!(settings.tls.names[0], "node-1");
    assert_eq!(settings.configz["kubeletconfig"]["port"], 10250);
    assert!(settings.webhook_authentication);
    assert_eq!(
        (settings.token_cache_ttl, settings.authorized_ttl, settings.unauthorized_ttl),
        (Duration::from_mins(2), Duration::from_mins(5), Duration::from_secs(30))
    );
    let err = Server::new(settings, endpoints()).unwrap_err();
    assert!(err.to_string().contains("no client provided, cannot use webhook authorization"), "{err}");

    config.kubelet.read_only_port = 10255;
    let settings = crate::settings::server(&config).unwrap();
    assert_eq!(settings.read_only_addr, Some("0.0.0.0:10255".parse().unwrap()));

    // An unvalidated port never turns into "any port".
    config.kubelet.port = 0;
    let err = crate::settings::server(&config).unwrap_err();
    assert_eq!(err.to_string(), "port: 0 must be between 1 and 65535, inclusive");
}

#[test]
fn bind_errors_name_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut settings = settings(dir.path());
    settings.healthz_addr = Some(addr);
    let err = Server::new(settings, endpoints()).unwrap_err();
    assert!(matches!(err, Error::Bind { .. }), "{err}");
    assert!(err.to_string().contains(&format!("healthz endpoint to {addr}")), "{err}");
}

#[tokio::test]
async fn disabled_listeners_are_not_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.https_addr = None;
    settings.healthz_addr = None;
    let server = Server::new(settings, endpoints()).unwrap();
    assert_eq!((server.https_addr(), server.healthz_addr()), (None, None));
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    server.run(shutdown).await.unwrap();
}

#[tokio::test]
async fn later_modules_add_authenticated_routes() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let route = axum::routing::get(|axum::Extension(user): axum::Extension<UserInfo>| async move { user.name });
    let server = Running::start(settings, endpoints().route("/stats/summary", route));
    let (status, _, body) = get(&client(dir.path(), None), &server.url("/stats/summary")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "system:anonymous"));
    server.stop().await;
}

/// A fake runtime running pod `web` (`main` running, `old` exited) and holding the
/// stopped pod `gone`.
async fn runtime_with_running_and_stopped_pods() -> Arc<crate::container::fake::FakeRuntime> {
    use crate::container::{RuntimeService as _, api, labels};
    let rt = Arc::new(crate::container::fake::FakeRuntime::default());
    for (uid, name, containers) in [("u1", "web", &["main", "old"][..]), ("u2", "gone", &["main"][..])] {
        let pod_labels: std::collections::HashMap<String, String> = [
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::POD_NAME.to_owned(), name.to_owned()),
            (labels::POD_NAMESPACE.to_owned(), "default".to_owned()),
        ]
        .into();
        let sandbox_config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_owned(),
                namespace: "default".to_owned(),
                uid: uid.to_owned(),
                attempt: 0,
            }),
            labels: pod_labels.clone(),
            ..Default::default()
        };
        let sandbox = rt.run_pod_sandbox(sandbox_config.clone(), String::new()).await.unwrap();
        for container in containers {
            let config = api::ContainerConfig {
                metadata: Some(api::ContainerMetadata { name: (*container).to_owned(), attempt: 0 }),
                image: Some(api::ImageSpec { image: "sha256:b0b0".to_owned(), ..Default::default() }),
                labels: pod_labels.clone(),
                ..Default::default()
            };
            let id = rt.create_container(&sandbox, config, sandbox_config.clone()).await.unwrap();
            rt.start_container(&id).await.unwrap();
            if *container == "old" {
                rt.exit_container(&id, 0);
            }
        }
        if name == "gone" {
            rt.stop_pod_sandbox(&sandbox).await.unwrap();
        }
    }
    rt
}

fn debugging_handlers(rt: Arc<crate::container::fake::FakeRuntime>, enabled: bool) -> DebuggingHandlers {
    DebuggingHandlers {
        runtime: rt,
        enable_debugging_handlers: enabled,
        enable_system_log_handler: false,
        streaming_connection_idle_timeout: Duration::from_mins(1),
        system_log_dir: "/nonexistent".into(),
    }
}

#[tokio::test]
async fn running_pods_lists_what_the_runtime_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let rt = runtime_with_running_and_stopped_pods().await;
    // Only nodes/proxy is granted: /runningpods/ asks for pods first, then proxy.
    let proxy_only = Arc::new(FakeAuthorizer::from_fn(|a| {
        Ok(if a.subresource == "proxy" { Decision::Allow } else { Decision::Deny("not granted".into()) })
    }));
    let server = Running::start(
        settings,
        endpoints().authorizer(proxy_only.clone()).debugging_handlers(debugging_handlers(rt, true)),
    );
    let client = client(dir.path(), None);

    let (status, content_type, body) = get(&client, &server.url("/runningpods/")).await;
    assert_eq!((status, content_type.as_str()), (StatusCode::OK, "application/json"), "{body}");
    assert!(body.starts_with(r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#), "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        list["items"],
        serde_json::json!([{
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "main", "image": "sha256:b0b0"}]},
        }]),
        "only the running container of the running pod, not the desired pods of /pods"
    );
    let (status, _, _) = get(&client, &server.url("/runningpods")).await;
    assert_eq!(status, StatusCode::OK);
    let response = client.post(server.url("/runningpods/")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 405, "GET only");

    let asked: Vec<(String, String, String)> =
        proxy_only.seen().into_iter().map(|a| (a.path, a.verb, a.subresource)).collect();
    let asked: Vec<(&str, &str, &str)> = asked.iter().map(|(p, v, s)| (p.as_str(), v.as_str(), s.as_str())).collect();
    assert_eq!(
        &asked[..4],
        [
            ("/runningpods/", "get", "pods"),
            ("/runningpods/", "get", "proxy"),
            ("/runningpods", "get", "pods"),
            ("/runningpods", "get", "proxy"),
        ]
    );
    server.stop().await;

    let denied = Arc::new(FakeAuthorizer::new(Decision::Deny("no".to_owned())));
    let rt = runtime_with_running_and_stopped_pods().await;
    let mut settings = self::settings(dir.path());
    settings.anonymous_auth = true;
    let server =
        Running::start(settings, endpoints().authorizer(denied).debugging_handlers(debugging_handlers(rt, true)));
    let (status, _, body) = get(&client, &server.url("/runningpods/")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["message"],
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])"
    );
    server.stop().await;
}

#[tokio::test]
async fn system_logs_serve_byte_ranges_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let line = "a log line of 32 bytes, numbered";
    let mut text = String::new();
    for i in 0..1000 {
        writeln!(text, "{line} {i:04}").unwrap();
    }
    std::fs::write(logs.path().join("syslog"), &text).unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let mut handlers = debugging_handlers(runtime_with_running_and_stopped_pods().await, true);
    handlers.enable_system_log_handler = true;
    handlers.system_log_dir = logs.path().to_path_buf();
    let server = Running::start(settings, endpoints().debugging_handlers(handlers));
    let client = client(dir.path(), None);

    // The last two lines, as `curl -r -76` asks for them.
    let response = client.get(server.url("/logs/syslog")).header("Range", "bytes=-76").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 206);
    let size = text.len();
    assert_eq!(response.headers()["content-range"], format!("bytes {}-{}/{size}", size - 76, size - 1).as_str());
    assert_eq!(response.headers()["accept-ranges"], "bytes");
    assert!(response.headers().contains_key("last-modified"));
    assert_eq!(response.text().await.unwrap(), format!("{line} 0998\n{line} 0999\n"));

    // HEAD: the headers of the same answer, no body.
    let response = client.head(server.url("/logs/syslog")).header("Range", "bytes=0-9").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 206);
    assert_eq!(response.headers()["content-length"], "10");
    assert_eq!(response.text().await.unwrap(), "");

    let response = client.get(server.url("/logs/syslog")).header("Range", "bytes=999999-").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 416);
    assert_eq!(response.headers()["content-range"], format!("bytes */{size}").as_str());
    server.stop().await;
}

#[tokio::test]
async fn running_pods_needs_the_debugging_handlers() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let rt = runtime_with_running_and_stopped_pods().await;
    let server = Running::start(settings, endpoints().debugging_handlers(debugging_handlers(rt, false)));
    let (status, _, body) = get(&client(dir.path(), None), &server.url("/runningpods/")).await;
    assert_eq!((status, body.as_str()), (StatusCode::METHOD_NOT_ALLOWED, "Debug endpoints are disabled.\n"));
    server.stop().await;
}

#[tokio::test]
async fn shutdown_before_serving_still_returns() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(settings(dir.path()), endpoints()).unwrap();
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), server.run(shutdown)).await.expect("run returns").unwrap();
}

#[test]
fn request_metric_labels_follow_upstream() {
    assert_eq!(super::url_root_path("/metrics/cadvisor"), "metrics/cadvisor");
    assert_eq!(super::url_root_path("/metrics"), "metrics");
    assert_eq!(super::url_root_path("/stats/summary"), "stats");
    assert_eq!(super::url_root_path("/containerLogs/ns/pod/c"), "containerLogs");
    assert_eq!(super::metric_path_bucket("/pods"), "pods");
    assert_eq!(super::metric_path_bucket("/metrics/resource"), "metrics/resource");
    assert_eq!(super::metric_path_bucket("/no/such/thing"), "other");
    assert_eq!(super::metric_path_bucket("/metrics/nope"), "other");
    assert_eq!(super::metric_method_bucket(&http::Method::GET), "GET");
    assert_eq!(super::metric_method_bucket(&http::Method::from_bytes(b"BREW").unwrap()), "other");
}

/// Sends `request` as is over plain TCP and returns what the server answered until it
/// closed the connection (or 10 s passed).
async fn raw_http(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// [`raw_http`] over TLS, trusting the certificate in `cert_dir`.
async fn raw_https(addr: SocketAddr, cert_dir: &Path, request: &[u8]) -> String {
    let config = tls_client_config(cert_dir, None, &[&rustls::version::TLS13]);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = connector.connect(name, tcp).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn the_read_only_port_serves_upstreams_read_only_paths_without_auth() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.read_only_addr = Some("127.0.0.1:0".parse().unwrap());
    let mut registry = Registry::default();
    let http_metrics = Arc::new(super::metrics::HttpMetrics::new(&mut registry));
    let registry = Arc::new(registry);
    let summary = axum::routing::get(|| async { r#"{"node":{}}"# });
    let events = axum::routing::get(|| async { "[]" });
    let server = Server::new(
        settings,
        Endpoints::new(Arc::new(FakePods::new(vec![sample_pod()])), registry.clone())
            .http_metrics(http_metrics)
            .metrics_endpoint("/metrics/probes", Arc::new(Registry::default()))
            .route("/stats/summary", summary)
            .route("/events", events),
    )
    .unwrap();
    let addr = server.read_only_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(shutdown.clone()));
    let plain = reqwest::Client::new();
    let url = |path: &str| format!("http://{addr}{path}");
    for (path, want) in [
        ("/pods", StatusCode::OK),
        ("/healthz", StatusCode::OK),
        ("/healthz/ping", StatusCode::OK),
        ("/stats/summary", StatusCode::OK),
        ("/metrics", StatusCode::OK),
        ("/metrics/probes", StatusCode::OK),
        ("/configz", StatusCode::NOT_FOUND),
        ("/events", StatusCode::NOT_FOUND),
        ("/spec/", StatusCode::NOT_FOUND),
        ("/nope", StatusCode::NOT_FOUND),
        ("/exec/ns/pod/c", StatusCode::METHOD_NOT_ALLOWED),
        ("/containerLogs/ns/pod/c", StatusCode::METHOD_NOT_ALLOWED),
        ("/logs/", StatusCode::METHOD_NOT_ALLOWED),
        ("/debug/pprof/", StatusCode::METHOD_NOT_ALLOWED),
        ("/runningpods/", StatusCode::METHOD_NOT_ALLOWED),
    ] {
        let (status, _, body) = get(&plain, &url(path)).await;
        assert_eq!(status, want, "{path}: {body}");
        if want == StatusCode::METHOD_NOT_ALLOWED {
            assert_eq!(body, "Debug endpoints are disabled.\n");
        }
    }
    let (_, _, pods) = get(&plain, &url("/pods")).await;
    assert!(pods.contains(r#""kind":"PodList""#), "{pods}");
    let (_, _, metrics) = get(&plain, &url("/metrics")).await;
    assert!(
        metrics.contains(
            r#"kubelet_http_requests_total{method="GET",path="pods",server_type="readonly",long_running="false"} 2"#
        ),
        "{metrics}"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn huge_heads_get_431_and_bad_paths_400() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    settings.read_only_addr = Some("127.0.0.1:0".parse().unwrap());
    let server = Server::new(settings, endpoints()).unwrap();
    let (https, read_only) = (server.https_addr().unwrap(), server.read_only_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(shutdown.clone()));

    let big = "x".repeat(64 * 1024);
    let huge = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
    assert!(raw_http(read_only, huge.as_bytes()).await.starts_with("HTTP/1.1 431"));
    assert!(raw_https(https, dir.path(), huge.as_bytes()).await.starts_with("HTTP/1.1 431"));
    // Just under the limit is fine.
    let fits =
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n", "x".repeat(30_000));
    assert!(raw_https(https, dir.path(), fits.as_bytes()).await.starts_with("HTTP/1.1 200"));
    // Many headers.
    let many = (0..200).fold(String::new(), |mut headers, i| {
        let _ = write!(headers, "X-H{i}: v\r\n");
        headers
    });
    let many = format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}Connection: close\r\n\r\n");
    assert!(raw_https(https, dir.path(), many.as_bytes()).await.starts_with("HTTP/1.1 431"));

    for path in ["/stats/../exec/ns/pod/c", "/pods/./x", "/stats/%2e%2e/configz", "/%2E/pods"] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let answer = raw_https(https, dir.path(), request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("dot segments"), "{answer}");
        let answer = raw_http(read_only, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
    }
    for (request, want) in [
        ("GET /pods?%ZZ=%%&&== HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "HTTP/1.1 200"),
        ("GET /%ZZ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "HTTP/1.1 404"),
        ("GET //pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "HTTP/1.1 404"),
        ("GET /pods\x01 HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400"),
        ("BREW /pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "HTTP/1.1 405"),
        ("GARBAGE\r\n\r\n", "HTTP/1.1 400"),
    ] {
        let answer = raw_https(https, dir.path(), request.as_bytes()).await;
        assert!(answer.starts_with(want), "{request:?}: {answer}");
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn slow_requests_time_out_and_slow_clients_are_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    settings.read_only_addr = Some("127.0.0.1:0".parse().unwrap());
    settings.limits.request_timeout = Duration::from_millis(300);
    settings.limits.header_read_timeout = Duration::from_millis(500);
    let hang = axum::routing::get(std::future::pending::<&'static str>);
    let server =
        Server::new(settings, endpoints().route("/stats/summary", hang.clone()).route("/exec/{ns}/{pod}/{c}", hang))
            .unwrap();
    let (https, read_only) = (server.https_addr().unwrap(), server.read_only_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(shutdown.clone()));
    let client = client(dir.path(), None);

    let (status, _, body) = get(&client, &format!("https://localhost:{}/stats/summary", https.port())).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["reason"], "Timeout");
    // Streaming paths have no request timeout.
    let streaming = client.get(format!("https://localhost:{}/exec/ns/pod/c", https.port())).send();
    assert!(tokio::time::timeout(Duration::from_secs(1), streaming).await.is_err(), "still waiting");

    // A client that sends half a request head is cut off; others are served meanwhile.
    let mut slow = tokio::net::TcpStream::connect(read_only).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let (status, _, _) = get(&reqwest::Client::new(), &format!("http://{read_only}/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the slow connection was closed");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_thousand_concurrent_scrapes_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    let server = Running::start(settings, endpoints());
    let client = client(dir.path(), None);
    let url = server.url("/metrics");
    let scrapes: Vec<_> = (0..1000)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { client.get(&url).send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    for scrape in scrapes {
        assert_eq!(scrape.await.unwrap().unwrap(), 200);
    }
    server.stop().await;
}

/// A self-signed certificate for `localhost` as PEM (certificate, key).
fn localhost_pair() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap().self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn configured_certificate_files_are_reloaded_when_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("serving.crt"), dir.path().join("serving.key"));
    let (first_cert, first_key) = localhost_pair();
    std::fs::write(&cert_file, &first_cert).unwrap();
    std::fs::write(&key_file, &first_key).unwrap();
    let trust = |pem: &str| {
        let trust_dir = tempfile::tempdir().unwrap();
        std::fs::write(trust_dir.path().join(SELF_SIGNED_CERT_FILE), pem).unwrap();
        trust_dir
    };
    let mut settings = settings(&dir.path().join("pki"));
    settings.anonymous_auth = true;
    settings.tls.cert_and_key = Some((cert_file.clone(), key_file.clone()));
    let server = Running::start(settings, endpoints());
    let first = trust(&first_cert);
    let (status, _, _) = get(&client(first.path(), None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);

    // Rotated: new connections get the new pair.
    let (second_cert, second_key) = localhost_pair();
    std::fs::write(&key_file, &second_key).unwrap();
    std::fs::write(&cert_file, &second_cert).unwrap();
    let second = trust(&second_cert);
    let (status, _, _) = get(&client(second.path(), None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(client(first.path(), None).get(server.url("/healthz")).send().await.is_err(), "the old one is gone");

    // A rotation that does not load (a key that does not match) keeps the last good pair.
    let (_, third_key) = localhost_pair();
    std::fs::write(&key_file, &third_key).unwrap();
    let (status, _, _) = get(&client(second.path(), None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    std::fs::write(&cert_file, "garbage").unwrap();
    let (status, _, _) = get(&client(second.path(), None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn the_client_ca_file_is_reloaded_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (TestCa::new("old-ca"), TestCa::new("new-ca"));
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &old_ca.pem).unwrap();
    let cert_dir = dir.path().join("pki");
    let mut settings = settings(&cert_dir);
    settings.tls.client_ca_file = Some(ca_file.clone());
    let server = Running::start(settings, endpoints());
    let (old_user, new_user) = (old_ca.client("old", "g"), new_ca.client("new", "g"));
    let status_of = async |identity: &Identity| get(&client(&cert_dir, Some(identity)), &server.url("/pods")).await.0;
    assert_eq!(status_of(&old_user).await, StatusCode::OK);
    assert_eq!(status_of(&new_user).await, StatusCode::UNAUTHORIZED);

    std::fs::write(&ca_file, &new_ca.pem).unwrap();
    assert_eq!(status_of(&old_user).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status_of(&new_user).await, StatusCode::OK);
    // A bundle that does not load keeps the last good one.
    std::fs::write(&ca_file, "not a certificate").unwrap();
    assert_eq!(status_of(&new_user).await, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn tls_min_version_and_cipher_suites_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(dir.path());
    settings.anonymous_auth = true;
    settings.tls.min_version = "VersionTLS13".to_owned();
    let server = Running::start(settings, endpoints());
    let tls12_only =
        |config: rustls::ClientConfig| reqwest::Client::builder().use_preconfigured_tls(config).build().unwrap();
    let old_client = tls12_only(tls_client_config(dir.path(), None, &[&rustls::version::TLS12]));
    assert!(old_client.get(server.url("/healthz")).send().await.is_err(), "TLS 1.2 is refused");
    let (status, _, _) = get(&client(dir.path(), None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;

    // TLS 1.2 limited to one suite: a client offering only another fails; TLS 1.3 is not
    // affected (as in Go).
    let mut settings = self::settings(dir.path());
    settings.anonymous_auth = true;
    settings.tls.cipher_suites = vec!["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384".to_owned()];
    let server = Running::start(settings, endpoints());
    let with_suite = |suite: rustls::SupportedCipherSuite| {
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = vec![suite];
        let mut roots = rustls::RootCertStore::empty();
        for cert in tls::read_certs(&dir.path().join(SELF_SIGNED_CERT_FILE)).unwrap() {
            roots.add(cert).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        reqwest::Client::builder().use_preconfigured_tls(config).build().unwrap()
    };
    let allowed = with_suite(rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384);
    assert_eq!(allowed.get(server.url("/healthz")).send().await.unwrap().status().as_u16(), 200);
    let other = with_suite(rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    assert!(other.get(server.url("/healthz")).send().await.is_err());
    let (status, _, _) = get(&client(dir.path(), None), &server.url("/healthz")).await;
    assert_eq!(status, StatusCode::OK, "TLS 1.3");
    server.stop().await;
}
