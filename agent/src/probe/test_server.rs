//! A local HTTP(S) server for the probe and hook tests, on 127.0.0.1 with an ephemeral
//! port. It records every request and answers by path:
//!
//! - `/ok`: 200 `ok`; `/status/<code>`: that status with body `status body`;
//! - `/redirect/<code>?to=<location>`: that status with the location, body `moved`;
//! - `/loop`: 302 to itself;
//! - `/slow`: 200 after five seconds; `/slow-body`: headers and a first chunk, then nothing;
//! - `/large`: 20 KiB of `x`;
//! - `/headers`: 200 with `name: value` lines of the request's headers.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

/// One request the server saw.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub path: String,
    pub headers: HeaderMap,
}

/// A running server; stops when dropped.
#[derive(Debug)]
pub(crate) struct TestServer {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: CancellationToken,
    handle: Option<axum_server::Handle<SocketAddr>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(h) = &self.handle {
            h.shutdown();
        }
    }
}

impl TestServer {
    /// A plain HTTP server.
    pub async fn http() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let app = router(seen.clone());
        let shutdown = stop.clone().cancelled_owned();
        tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await });
        Self { addr, seen, stop, handle: None }
    }

    /// An HTTPS server with a self-signed certificate for `localhost`.
    pub fn https() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap().self_signed(&key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handle = axum_server::Handle::new();
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config));
        let serve = axum_server::from_tcp_rustls(listener, tls)
            .unwrap()
            .handle(handle.clone())
            .serve(router(seen.clone()).into_make_service());
        tokio::spawn(serve);
        Self { addr, seen, stop: CancellationToken::new(), handle: Some(handle) }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn router(seen: Arc<Mutex<Vec<Seen>>>) -> Router {
    Router::new().fallback(answer).with_state(seen)
}

async fn answer(State(seen): State<Arc<Mutex<Vec<Seen>>>>, request: Request) -> Response {
    let uri = request.uri().clone();
    let path = uri.path_and_query().map_or_else(|| uri.path().to_string(), ToString::to_string);
    seen.lock().unwrap().push(Seen { path: path.clone(), headers: request.headers().clone() });
    let query = uri.query().unwrap_or_default();
    match uri.path() {
        "/ok" => "ok".into_response(),
        "/loop" => (StatusCode::FOUND, [(header::LOCATION, "/loop")], "again").into_response(),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "late".into_response()
        }
        "/slow-body" => {
            let chunks =
                futures::stream::once(async { Ok::<_, Infallible>("first") }).chain(futures::stream::pending());
            Response::new(Body::from_stream(chunks))
        }
        "/large" => "x".repeat(20 * 1024).into_response(),
        "/headers" => {
            let mut lines = String::new();
            for (n, v) in request.headers() {
                let _ = writeln!(lines, "{n}: {}", String::from_utf8_lossy(v.as_bytes()));
            }
            lines.into_response()
        }
        p if p.starts_with("/status/") => {
            let code = p["/status/".len()..].parse().unwrap();
            (StatusCode::from_u16(code).unwrap(), "status body").into_response()
        }
        p if p.starts_with("/redirect/") => {
            let code = p["/redirect/".len()..].parse().unwrap();
            let to =
                url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "to").map(|(_, v)| v.into_owned());
            (StatusCode::from_u16(code).unwrap(), [(header::LOCATION, to.unwrap_or_default())], "moved").into_response()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The pod the handler and hook tests probe: `prod/web`, uid `uid-1`.
pub(crate) fn pod() -> k8s_openapi::api::core::v1::Pod {
    k8s_openapi::api::core::v1::Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("web".into()),
            namespace: Some("prod".into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}
