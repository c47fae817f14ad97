//! The HTTP API's paths, queries and the headers they read, sent in process to the routers
//! the agent serves (`server::Server::into_routers`: routing, the request guard,
//! authentication and authorization, request counting, the handlers' path and query
//! parsing), with the state the server's unit tests use: a fake pod `default/web` whose
//! containers run in a fake runtime, a log file per container instance, and a `/logs/`
//! root of its own.
//!
//! The input is `[METHOD ]request-target` on the first line, then `Name: value` header
//! lines (malformed ones are dropped, as hyper would refuse them). Besides never panicking
//! or hanging, these must hold:
//! - with an authorizer that allows only the `pods` subresource, a request for anything
//!   but `/pods` and `/runningpods` is refused before any handler (400, 401 or 403): the
//!   mapping of paths to subresources agrees with the routing;
//! - the read-only API answers 2xx only below `/healthz`, `/pods`, `/stats` and `/metrics`;
//! - `/logs/` never serves a file outside its root (one sits next to it, and symlinks
//!   inside point at it);
//! - every subresource asked is one the kubelet knows.
//!
//! `SWIFTLET_FUZZ_DEBUG=1` prints each request's status and body (the HTTPS API's, every
//! authorizer allowing) when running the target on inputs.
//!
//! The streaming URLs of the fake runtime have a scheme the proxy refuses, so an upgrade
//! request never opens a connection.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use prometheus_client::registry::Registry;
use swiftlet::config::AUTHORIZATION_MODE_ALWAYS_ALLOW;
use swiftlet::container::fake::FakeRuntime;
use swiftlet::container::{RuntimeService as _, api, labels};
use swiftlet::server::{
    DebuggingHandlers, Decision, Endpoints, FakeAuthorizer, FakeHealthCheck, FakePods, FakeTokenAuthenticator, Limits,
    RequestAttributes, Server, ServerSettings, TlsSettings, UserInfo,
};
use tower::ServiceExt as _;

/// What a file outside the `/logs/` root holds.
const SECRET: &[u8] = b"FUZZ-SECRET-OUTSIDE-THE-LOG-ROOT";
/// The subresources of `nodes` the kubelet asks about.
const SUBRESOURCES: [&str; 9] =
    ["pods", "proxy", "healthz", "configz", "statusz", "stats", "metrics", "log", "checkpoint"];
/// The fakes record every call; rebuilt this often, their records stay small.
const REBUILD_EVERY: u32 = 5000;

fuzz_target!(|data: &[u8]| {
    let Some(request) = Request::parse(data) else { return };
    let mut fixture = FIXTURE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let fixture = fixture.get_or_insert_with(Fixture::new);
    fixture.uses += 1;
    if fixture.uses % REBUILD_EVERY == 0 {
        fixture.routers = fixture.runtime.block_on(Routers::new(&fixture.dir));
    }
    let path = request.path();
    let runtime = &fixture.runtime;
    let routers = &fixture.routers;
    // The query parser of `/stats/summary` (the handler needs a stats provider).
    let _ = swiftlet::stats::only_cpu_and_memory(request.query());

    // Only `/logs/` bodies: other handlers may echo the request, which may hold the bytes.
    let logs = is_subpath(&path, "/logs");
    let (status, body) = runtime.block_on(request.send(&routers.https));
    if std::env::var_os("SWIFTLET_FUZZ_DEBUG").is_some() {
        eprintln!("{request:?}: {status} {:?}", String::from_utf8_lossy(&body[..body.len().min(300)]));
    }
    assert!(!(logs && contains(&body, SECRET)), "{request:?} served a file outside the /logs/ root ({status})");

    let (status, _) = runtime.block_on(request.send(&routers.pods_only));
    if !is_subpath(&path, "/pods") && !is_subpath(&path, "/runningpods") {
        assert!(
            [StatusCode::BAD_REQUEST, StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status),
            "{request:?} with only the pods subresource allowed: {status}"
        );
    }

    let (status, body) = runtime.block_on(request.send(&routers.read_only));
    if status.is_success() {
        assert!(
            ["/healthz", "/pods", "/stats", "/metrics"].iter().any(|p| is_subpath(&path, p)),
            "{request:?} on the read-only port: {status}"
        );
    }
    assert!(!(logs && contains(&body, SECRET)), "{request:?} on the read-only port served a file outside /logs/");

    let _ = runtime.block_on(request.send(&routers.healthz));
});

static FIXTURE: Mutex<Option<Fixture>> = Mutex::new(None);

/// Built once per process.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    dir: PathBuf,
    routers: Routers,
    uses: u32,
}

impl Fixture {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
        let dir = std::env::temp_dir().join(format!("swiftlet-fuzz-http-{}", std::process::id()));
        let logs = dir.join("logs");
        std::fs::create_dir_all(logs.join("pods/sub")).expect("the scratch directory");
        std::fs::create_dir_all(dir.join("pki")).expect("the scratch directory");
        std::fs::write(logs.join("syslog"), "May 20 10:00:00 node swiftlet: started\n").expect("a log file");
        std::fs::write(logs.join("pods/sub/x.log"), "x\n").expect("a log file");
        std::fs::write(dir.join("secret"), SECRET).expect("the file outside the root");
        let _ = std::os::unix::fs::symlink("../secret", logs.join("escape"));
        let _ = std::os::unix::fs::symlink(dir.join("secret"), logs.join("pods/absolute"));
        let routers = runtime.block_on(Routers::new(&dir));
        Self { runtime, dir, routers, uses: 0 }
    }
}

/// The same agent behind three authorizers, and its read-only and healthz routers.
struct Routers {
    https: Router,
    pods_only: Router,
    read_only: Router,
    healthz: Router,
}

impl Routers {
    async fn new(dir: &Path) -> Self {
        let (runtime, pod) = fake_runtime_and_pod(dir).await;
        let endpoints = || {
            let tokens = FakeTokenAuthenticator::default();
            tokens.add("fuzz-token", UserInfo { name: "fuzz".to_owned(), ..UserInfo::default() });
            let mut registry = Registry::default();
            let http_metrics = swiftlet::server::metrics::HttpMetrics::new(&mut registry);
            let unhealthy = FakeHealthCheck::new("pleg");
            unhealthy.set_failing("PLEG is not healthy: fuzzing");
            Endpoints::new(Arc::new(FakePods::new(vec![pod.clone()])), Arc::new(registry))
                .http_metrics(Arc::new(http_metrics))
                .metrics_endpoint("/metrics/probes", Arc::new(Registry::default()))
                .health_check(Arc::new(FakeHealthCheck::new("syncloop")))
                .health_check(Arc::new(unhealthy))
                .token_authenticator(Arc::new(tokens))
                .debugging_handlers(DebuggingHandlers {
                    runtime: runtime.clone(),
                    enable_debugging_handlers: true,
                    enable_system_log_handler: true,
                    streaming_connection_idle_timeout: Duration::from_secs(1),
                    system_log_dir: dir.join("logs"),
                })
        };
        let all = Server::new(settings(dir), endpoints()).expect("the server").into_routers();
        let pods_only = FakeAuthorizer::from_fn(|attributes: &RequestAttributes| {
            assert!(SUBRESOURCES.contains(&attributes.subresource.as_str()), "{attributes:?}");
            Ok(if attributes.subresource == "pods" { Decision::Allow } else { Decision::Deny("fuzz".to_owned()) })
        });
        let pods_only =
            Server::new(settings(dir), endpoints().authorizer(Arc::new(pods_only))).expect("the server").into_routers();
        Self {
            https: all.https.expect("HTTPS"),
            pods_only: pods_only.https.expect("HTTPS"),
            read_only: all.read_only.expect("read-only"),
            healthz: all.healthz.expect("healthz"),
        }
    }
}

/// Every listener on an ephemeral loopback port (closed again at once by `into_routers`),
/// anonymous requests allowed.
fn settings(dir: &Path) -> ServerSettings {
    let any_port = Some("127.0.0.1:0".parse().expect("an address"));
    ServerSettings {
        https_addr: any_port,
        read_only_addr: any_port,
        healthz_addr: any_port,
        tls: TlsSettings {
            cert_and_key: None,
            cert_dir: dir.join("pki"),
            names: vec!["fuzz-node".to_owned()],
            client_ca_file: None,
            cipher_suites: Vec::new(),
            min_version: String::new(),
            bootstrap: None,
        },
        node_name: "fuzz-node".to_owned(),
        anonymous_auth: true,
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

/// Pod `default/web` (UID `fuzz-uid`): container `main` (exited in the runtime, so that
/// following its log ends, after an earlier instance), and `sh` running (exec, attach and
/// run reach the runtime; it has no log file).
async fn fake_runtime_and_pod(dir: &Path) -> (Arc<FakeRuntime>, Pod) {
    let runtime = Arc::new(FakeRuntime::default());
    runtime.set_streaming_url("fuzz://streaming.invalid");
    let uid = "fuzz-uid";
    let pod_labels = |container: &str| {
        [(labels::POD_UID.to_owned(), uid.to_owned()), (labels::CONTAINER_NAME.to_owned(), container.to_owned())]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect()
    };
    let sandbox = api::PodSandboxConfig { labels: pod_labels(""), ..Default::default() };
    let sb = runtime.run_pod_sandbox(sandbox.clone(), String::new()).await.expect("a sandbox");
    let mut ids = Vec::new();
    for (name, log) in [
        (
            "main",
            "2026-01-02T03:04:05Z stdout F before\n2026-01-02T03:04:05Z stderr P par\n2026-01-02T03:04:05Z stderr F tial\n",
        ),
        ("main", "2026-01-02T03:04:06Z stdout F now\n2026-01-02T03:04:07Z stderr F more\nnot a CRI line\n"),
        ("sh", ""),
    ] {
        let log_path = if log.is_empty() {
            String::new()
        } else {
            let path = dir.join(format!("container-{}.log", ids.len()));
            std::fs::write(&path, log).expect("a container log");
            path.display().to_string()
        };
        let config = api::ContainerConfig { labels: pod_labels(name), log_path, ..Default::default() };
        let id = runtime.create_container(&sb, config, sandbox.clone()).await.expect("a container");
        runtime.start_container(&id).await.expect("started");
        ids.push(id);
    }
    runtime.exit_container(&ids[0], 1);
    runtime.exit_container(&ids[1], 0);
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "main", "image": "busybox"}, {"name": "sh", "image": "busybox"}]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "main", "image": "", "imageID": "", "ready": true, "restartCount": 1,
             "containerID": format!("containerd://{}", ids[1]), "state": {"running": {}},
             "lastState": {"terminated": {"exitCode": 1, "containerID": format!("containerd://{}", ids[0])}}},
            {"name": "sh", "image": "", "imageID": "", "ready": true, "restartCount": 0,
             "containerID": format!("containerd://{}", ids[2]), "state": {"running": {}}}
        ]}
    }))
    .expect("the pod");
    (runtime, pod)
}

/// One request from the fuzzer's bytes.
#[derive(Debug)]
struct Request {
    method: Method,
    uri: http::Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Request {
    fn parse(data: &[u8]) -> Option<Self> {
        let mut lines = data.split(|&b| b == b'\n');
        let first = lines.next()?;
        let (method, target) = match first.iter().position(|&b| b == b' ') {
            Some(space) => match Method::from_bytes(&first[..space]) {
                Ok(method) => (method, &first[space + 1..]),
                Err(_) => (Method::GET, first),
            },
            None => (Method::GET, first),
        };
        let uri = http::Uri::try_from(target).ok()?;
        let headers = lines
            .filter_map(|line| {
                let colon = line.iter().position(|&b| b == b':')?;
                let name = HeaderName::from_bytes(&line[..colon]).ok()?;
                let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).ok()?;
                Some((name, value))
            })
            .collect();
        Some(Self { method, uri, headers })
    }

    fn path(&self) -> String {
        self.uri.path().to_owned()
    }

    fn query(&self) -> Option<&str> {
        self.uri.query()
    }

    /// The status and the whole body.
    async fn send(&self, router: &Router) -> (StatusCode, Vec<u8>) {
        let mut builder = http::Request::builder().method(self.method.clone()).uri(self.uri.clone());
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let request = builder.body(Body::empty()).expect("parts that parsed make a request");
        let response = router.clone().oneshot(request).await.expect("routers are infallible");
        let status = response.status();
        let body = response.into_body().collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
        (status, body)
    }
}

/// Upstream `isSubpath`, as the read-only filter and the authorization use it.
fn is_subpath(path: &str, prefix: &str) -> bool {
    path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
