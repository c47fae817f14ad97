//! `/exec`, `/attach`, `/portForward` and `/run` (upstream `pkg/kubelet/server/server.go`
//! `getExec`, `getAttach`, `getPortForward`, `getRun`, `proxyStream`).
//!
//! The streaming three find the pod (by namespace and name among the pods the agent knows;
//! with a UID in the path, that UID must match), ask the runtime for the running container
//! (or the pod's ready sandbox) and its streaming URL (CRI `Exec`, `Attach`,
//! `PortForward`), and then proxy the client's upgrade request to that URL, as the kubelet
//! has done since 1.28: the request goes to the runtime's streaming server with the
//! client's headers (`Upgrade`, `Connection`, `X-Stream-Protocol-Version`,
//! `Sec-WebSocket-*`, ...), and if it answers `101 Switching Protocols` the client gets the
//! same answer and the two upgraded connections are spliced byte for byte. The protocol is
//! whatever client and runtime agree on: SPDY/3.1 (`X-Stream-Protocol-Version:
//! v4.channel.k8s.io`, ...), WebSocket with `v5.channel.k8s.io` / `v4.channel.k8s.io`
//! (channel-prefixed frames), or WebSocket port forwarding (`portforward.k8s.io`,
//! `v4.channel.k8s.io`); the agent reads none of the frames. Any other answer of the
//! runtime goes back to the client as it is.
//!
//! A spliced connection on which nothing moved for `streamingConnectionIdleTimeout` (4 h)
//! is closed.
//!
//! Deviations from upstream: a container or pod that is not running in the runtime is 404
//! (upstream: 500 with the same words); the client's credentials (`Authorization`, the
//! WebSocket bearer-token subprotocol) are not passed to the runtime; only `http://`
//! streaming URLs are proxied (containerd's default; with `enable_tls_streaming` it
//! serves a self-signed certificate that upstream's proxy would refuse too).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tracing::Instrument as _;

use super::PodsProvider;
use crate::container::{RuntimeService, api, labels};

/// How long connecting to the runtime's streaming server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the streaming handlers need.
#[derive(Clone)]
pub(crate) struct StreamingState {
    pub(crate) pods: Arc<dyn PodsProvider>,
    pub(crate) runtime: Arc<dyn RuntimeService>,
    /// `streamingConnectionIdleTimeout`.
    pub(crate) idle_timeout: Duration,
}

/// A plain-text error response, as upstream's `WriteError`.
pub(crate) fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message.into()).into_response()
}

/// The query parameters in order, decoded.
pub(crate) fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect()
}

/// Upstream `FormValue`: the first value of `name`, or "".
fn form_value<'a>(query: &'a [(String, String)], name: &str) -> &'a str {
    query.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
}

/// The pod `namespace/name` the agent knows, with its status.
pub(crate) fn find_pod(pods: &dyn PodsProvider, namespace: &str, name: &str) -> Option<Pod> {
    pods.pods()
        .into_iter()
        .find(|p| p.metadata.namespace.as_deref() == Some(namespace) && p.metadata.name.as_deref() == Some(name))
}

/// The path of `/exec`, `/attach` and `/run`: `{ns}/{pod}/{container}` or
/// `{ns}/{pod}/{uid}/{container}`.
#[derive(Debug)]
pub(crate) struct ContainerPath {
    namespace: String,
    pod: String,
    uid: Option<String>,
    container: String,
}

impl ContainerPath {
    fn from_segments(segments: Vec<String>) -> Option<Self> {
        let mut s = segments.into_iter();
        match (s.next(), s.next(), s.next(), s.next(), s.next()) {
            (Some(namespace), Some(pod), Some(container), None, None) => {
                Some(Self { namespace, pod, uid: None, container })
            }
            (Some(namespace), Some(pod), Some(uid), Some(container), None) => {
                Some(Self { namespace, pod, uid: Some(uid), container })
            }
            _ => None,
        }
    }
}

/// Stream options of exec and attach (upstream `remotecommand.NewOptions`).
#[expect(clippy::struct_excessive_bools, reason = "upstream's four independent stream flags")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamOptions {
    pub(crate) stdin: bool,
    pub(crate) stdout: bool,
    pub(crate) stderr: bool,
    pub(crate) tty: bool,
}

impl StreamOptions {
    /// The query parameters are upstream's `ExecStdinParam` and friends: `input`,
    /// `output`, `error` and `tty`, each on when `1` (what kube-apiserver sends when it
    /// proxies `kubectl exec`/`attach`); a TTY has no separate stderr.
    pub(crate) fn from_query(query: &[(String, String)]) -> Result<Self, String> {
        let on = |name| form_value(query, name) == "1";
        let tty = on("tty");
        let opts = Self { stdin: on("input"), stdout: on("output"), stderr: on("error") && !tty, tty };
        if !opts.stdin && !opts.stdout && !opts.stderr {
            return Err("you must specify at least 1 of stdin, stdout, stderr".to_owned());
        }
        Ok(opts)
    }
}

/// The ports of a WebSocket port-forward request (upstream `NewV4Options`); SPDY clients
/// name the port per stream, so none are needed then.
pub(crate) fn port_forward_ports(query: &[(String, String)], websocket: bool) -> Result<Vec<i32>, String> {
    if !websocket {
        return Ok(Vec::new());
    }
    let values: Vec<&str> = query.iter().filter(|(k, _)| k == "port").map(|(_, v)| v.as_str()).collect();
    if values.is_empty() {
        return Err("query parameter \"port\" is required".to_owned());
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".to_owned());
        }
        for p in value.split(',') {
            let port: u16 = p.parse().map_err(|e| format!("unable to parse {value:?} as a port: {e}"))?;
            if port < 1 {
                return Err(format!("port {value:?} must be > 0"));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// Whether `headers` ask for an upgrade: `Connection` has the `upgrade` token and
/// `Upgrade` is set.
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// Whether `headers` ask for a WebSocket (upstream `wsstream.IsWebSocketRequest`).
fn is_websocket(headers: &HeaderMap) -> bool {
    is_upgrade(headers)
        && headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The newest running container `name` of pod `uid` in the runtime.
async fn running_container(
    runtime: &dyn RuntimeService,
    uid: &str,
    name: &str,
) -> Result<Option<String>, Box<Response>> {
    let filter = api::ContainerFilter {
        state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
        label_selector: [
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::CONTAINER_NAME.to_owned(), name.to_owned()),
        ]
        .into(),
        ..Default::default()
    };
    match runtime.list_containers(Some(filter)).await {
        Ok(mut containers) => {
            containers.sort_by_key(|c| c.created_at);
            Ok(containers.pop().map(|c| c.id))
        }
        Err(e) => Err(Box::new(runtime_error(&e))),
    }
}

/// The newest ready sandbox of pod `uid`.
async fn ready_sandbox(runtime: &dyn RuntimeService, uid: &str) -> Result<Option<String>, Box<Response>> {
    let filter = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
        label_selector: [(labels::POD_UID.to_owned(), uid.to_owned())].into(),
        ..Default::default()
    };
    match runtime.list_pod_sandbox(Some(filter)).await {
        Ok(mut sandboxes) => {
            sandboxes.sort_by_key(|s| s.created_at);
            Ok(sandboxes.pop().map(|s| s.id))
        }
        Err(e) => Err(Box::new(runtime_error(&e))),
    }
}

/// A CRI error as upstream's `streaming.WriteError`: `NotFound` 404, `ResourceExhausted` 429,
/// else 500.
fn runtime_error(error: &crate::container::Error) -> Response {
    let status = match error {
        crate::container::Error::Rpc { status, .. } => match status.code() {
            tonic::Code::NotFound => StatusCode::NOT_FOUND,
            tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text(status, error.to_string())
}

/// The pod of a request and its UID, or the 404.
fn pod_and_uid(
    state: &StreamingState,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<String, Box<Response>> {
    let pod = find_pod(state.pods.as_ref(), namespace, name)
        .ok_or_else(|| Box::new(text(StatusCode::NOT_FOUND, "pod does not exist")))?;
    let pod_uid = pod.metadata.uid.unwrap_or_default();
    if uid.is_some_and(|u| u != pod_uid) {
        return Err(Box::new(text(StatusCode::NOT_FOUND, "pod not found")));
    }
    Ok(pod_uid)
}

/// The running container of a request, or the error response.
async fn container_of(state: &StreamingState, path: &ContainerPath) -> Result<String, Box<Response>> {
    let uid = pod_and_uid(state, &path.namespace, &path.pod, path.uid.as_deref())?;
    running_container(state.runtime.as_ref(), &uid, &path.container)
        .await?
        .ok_or_else(|| Box::new(text(StatusCode::NOT_FOUND, format!("container not found ({:?})", path.container))))
}

/// Which streaming call a request is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Exec,
    Attach,
}

/// `/exec/{ns}/{pod}[/{uid}]/{container}?command=...&input=1&...` (GET or POST).
pub(crate) async fn exec(
    State(state): State<StreamingState>,
    Path(segments): Path<Vec<String>>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    exec_or_attach(Kind::Exec, state, segments, query, request).await
}

/// `/attach/{ns}/{pod}[/{uid}]/{container}?input=1&...` (GET or POST).
pub(crate) async fn attach(
    State(state): State<StreamingState>,
    Path(segments): Path<Vec<String>>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    exec_or_attach(Kind::Attach, state, segments, query, request).await
}

async fn exec_or_attach(
    kind: Kind,
    state: StreamingState,
    segments: Vec<String>,
    query: Option<String>,
    request: Request,
) -> Response {
    let Some(path) = ContainerPath::from_segments(segments) else {
        return super::not_found().await;
    };
    let query = query_pairs(query.as_deref());
    let opts = match StreamOptions::from_query(&query) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let id = match container_of(&state, &path).await {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let url = match kind {
        Kind::Exec => {
            let cmd = query.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
            state
                .runtime
                .exec(api::ExecRequest {
                    container_id: id,
                    cmd,
                    tty: opts.tty,
                    stdin: opts.stdin,
                    stdout: opts.stdout,
                    stderr: opts.stderr,
                })
                .await
        }
        Kind::Attach => {
            state
                .runtime
                .attach(api::AttachRequest {
                    container_id: id,
                    stdin: opts.stdin,
                    tty: opts.tty,
                    stdout: opts.stdout,
                    stderr: opts.stderr,
                })
                .await
        }
    };
    match url {
        Ok(url) => proxy_stream(request, &url, state.idle_timeout).await,
        Err(e) => runtime_error(&e),
    }
}

/// `/portForward/{ns}/{pod}[/{uid}]` (GET or POST; WebSocket clients add `?port=`).
pub(crate) async fn port_forward(
    State(state): State<StreamingState>,
    Path(segments): Path<Vec<String>>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    let (namespace, pod, uid) = match segments.as_slice() {
        [ns, pod] => (ns, pod, None),
        [ns, pod, uid] => (ns, pod, Some(uid.as_str())),
        _ => return super::not_found().await,
    };
    let ports = match port_forward_ports(&query_pairs(query.as_deref()), is_websocket(request.headers())) {
        Ok(p) => p,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let pod_uid = match pod_and_uid(&state, namespace, pod, uid) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let sandbox = match ready_sandbox(state.runtime.as_ref(), &pod_uid).await {
        Ok(Some(id)) => id,
        Ok(None) => return text(StatusCode::NOT_FOUND, format!("failed to find sandbox for pod {pod:?}")),
        Err(r) => return *r,
    };
    match state.runtime.port_forward(&sandbox, ports).await {
        Ok(url) => proxy_stream(request, &url, state.idle_timeout).await,
        Err(e) => runtime_error(&e),
    }
}

/// `POST /run/{ns}/{pod}[/{uid}]/{container}?cmd=...`: runs `cmd` (split at spaces) with
/// `ExecSync` and answers its stdout then stderr (upstream `getRun`: JSON content type,
/// whatever the output; a non-zero exit is a 500 naming the code and stderr).
pub(crate) async fn run(
    State(state): State<StreamingState>,
    Path(segments): Path<Vec<String>>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(path) = ContainerPath::from_segments(segments) else {
        return super::not_found().await;
    };
    let query = query_pairs(query.as_deref());
    let id = match container_of(&state, &path).await {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let cmd: Vec<String> = form_value(&query, "cmd").split(' ').map(str::to_owned).collect();
    match state.runtime.exec_sync(&id, cmd.clone(), Duration::ZERO).await {
        Ok(r) if r.exit_code == 0 => {
            let mut body = r.stdout;
            body.extend_from_slice(&r.stderr);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Ok(r) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("command '{}' exited with {}: {}", cmd.join(" "), r.exit_code, String::from_utf8_lossy(&r.stderr)),
        ),
        Err(e) => runtime_error(&e),
    }
}

/// Headers that are not passed to the runtime: hop-by-hop ones other than the upgrade's,
/// and the client's credentials.
const NOT_FORWARDED: [HeaderName; 6] = [
    header::HOST,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// The WebSocket subprotocol that carries a bearer token.
const BEARER_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// The headers of the request to the runtime.
fn forwarded_headers(from: &HeaderMap, authority: &str) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(from.len() + 1);
    for (name, value) in from {
        if NOT_FORWARDED.contains(name) {
            continue;
        }
        if name == header::SEC_WEBSOCKET_PROTOCOL {
            let kept: Vec<&str> = value
                .to_str()
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty() && !p.starts_with(BEARER_PROTOCOL_PREFIX))
                .collect();
            if let Ok(v) = HeaderValue::from_str(&kept.join(", "))
                && !kept.is_empty()
            {
                headers.append(name, v);
            }
            continue;
        }
        headers.append(name, value.clone());
    }
    if let Ok(host) = HeaderValue::from_str(authority) {
        headers.insert(header::HOST, host);
    }
    headers
}

/// Proxies the upgrade request `request` to `url` and splices the connections (see the
/// module docs); upstream `proxyStream` with `upgradeRequired`.
pub(crate) async fn proxy_stream(mut request: Request, url: &str, idle_timeout: Duration) -> Response {
    if !is_upgrade(request.headers()) {
        return text(StatusCode::BAD_REQUEST, "Upgrade request required");
    }
    let target = match url::Url::parse(url) {
        Ok(u) if u.scheme() == "http" && u.host_str().is_some() => u,
        Ok(u) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("unsupported streaming URL scheme {:?}", u.scheme()),
            );
        }
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("invalid streaming URL {url:?}: {e}")),
    };
    let host = target.host_str().unwrap_or_default().to_owned();
    let port = target.port_or_known_default().unwrap_or(80);
    let authority = match target.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    let path_and_query = match target.query() {
        Some(q) => format!("{}?{q}", target.path()),
        None => target.path().to_owned(),
    };
    let client_upgrade = hyper::upgrade::on(&mut request);
    let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((host.as_str(), port))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("error dialing backend: {e}")),
            Err(_) => return text(StatusCode::INTERNAL_SERVER_ERROR, "error dialing backend: timed out"),
        };
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
        Ok(c) => c,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("error dialing backend: {e}")),
    };
    tokio::spawn(
        async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "streaming server connection");
            }
        }
        .in_current_span(),
    );
    let mut backend_request = http::Request::builder()
        .method(request.method().clone())
        .uri(path_and_query)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("a valid request");
    *backend_request.headers_mut() = forwarded_headers(request.headers(), &authority);
    let mut backend_response = match sender.send_request(backend_request).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("error proxying to the runtime: {e}")),
    };
    if backend_response.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime's refusal, as it is.
        let (parts, body) = backend_response.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let backend_upgrade = hyper::upgrade::on(&mut backend_response);
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = backend_response.headers().clone();
    tokio::spawn(
        async move {
            let (client, backend) = match tokio::try_join!(client_upgrade, backend_upgrade) {
                Ok(both) => both,
                Err(e) => {
                    tracing::debug!(error = %e, "upgrading a streaming connection");
                    return;
                }
            };
            match splice(TokioIo::new(client), TokioIo::new(backend), idle_timeout).await {
                Ok(Spliced::Closed) => tracing::debug!("streaming connection closed"),
                Ok(Spliced::Idle) => tracing::info!(?idle_timeout, "streaming connection idle: closed"),
                Err(e) => tracing::debug!(error = %e, "streaming connection"),
            }
        }
        .in_current_span(),
    );
    response
}

/// How a splice ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Spliced {
    /// Both sides finished.
    Closed,
    /// Nothing moved for the idle timeout.
    Idle,
}

/// Copies between `a` and `b` both ways until both directions end (each end's EOF shuts
/// the other's write side) or nothing moved for `idle`.
pub(crate) async fn splice<A, B>(a: A, b: B, idle: Duration) -> std::io::Result<Spliced>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = tokio::time::Instant::now();
    // Milliseconds since `start` of the last byte moved.
    let last = AtomicU64::new(0);
    let touch = || last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let both = async {
        let (x, y) = tokio::join!(copy(&mut a_read, &mut b_write, &touch), copy(&mut b_read, &mut a_write, &touch));
        x.and(y)
    };
    let watchdog = async {
        loop {
            let last_moved = start + Duration::from_millis(last.load(Ordering::Relaxed));
            if tokio::time::Instant::now() >= last_moved + idle {
                return;
            }
            tokio::time::sleep_until(last_moved + idle).await;
        }
    };
    tokio::select! {
        result = both => result.map(|()| Spliced::Closed),
        () = watchdog => Ok(Spliced::Idle),
    }
}

/// One direction of [`splice`]: `from` to `to` until `from` ends, then shuts `to`'s write
/// side; `touch` on every read.
async fn copy<R, W>(from: &mut R, to: &mut W, touch: &impl Fn()) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        touch();
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
    }
}

#[cfg(test)]
mod tests;
