//! HTTP probes (upstream `pkg/probe/http`) and the `GET` client they share with
//! lifecycle `httpGet` hooks.
//!
//! [`HttpGetRequest::for_action`] builds the request as upstream
//! `NewRequestForHTTPGetAction`: scheme (lower-cased, default `http`), host (default the
//! pod IP), port (number or container port name), path (with its query), the
//! `httpHeaders` in order, `User-Agent: kube-<purpose>/<major>.<minor>` and `Accept: */*`
//! unless a header of that name is given (an empty `Accept` removes it), and a `Host`
//! header as the request's host.
//!
//! [`HttpClient::get`] behaves as the kubelet's Go client: a new connection per request
//! (`Connection: close`, no compression), TLS without certificate verification, one
//! deadline over the whole exchange (connect, redirects, body), redirects (301, 302, 303,
//! 307, 308 with a `Location`) followed only to the same host name and at most 9 times
//! (the 10th fails with `stopped after 10 redirects`); a redirect to another host is
//! returned as the response. At most 10 KiB of the body is read. Errors read as Go's
//! `Get "<url>": <cause>`. An HTTPS request answered in plain HTTP fails with
//! `http: server gave HTTP response to HTTPS client` (hooks then retry over HTTP).
//!
//! [`HttpProber::probe`] maps the response as upstream `DoHTTPProbe`: 200–299 success with
//! the body as output, 300–399 a warning `Probe terminated redirects, Response body: ...`,
//! anything else a failure `HTTP probe failed with statuscode: <code>` (without the body,
//! as upstream); a request error is a failure with its text; a body read error (a timeout
//! while reading it) an error with result `Failure`.
//!
//! Deviations: HTTP/1.1 only (Go may negotiate HTTP/2 over TLS); dot segments in the
//! probe's own path are sent as written but resolved in a redirect's `Location`, as Go.

use std::fmt;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::{Outcome, ProbeError, ProbeResponse, ProbeResult, format, resolve_container_port, tcp, user_agent};

/// How much of a response body is read (upstream `maxRespBodyLength`).
pub const MAX_RESPONSE_BODY: usize = 10 * 1024;

/// Redirect checks that fail (upstream: `len(via) >= 10`).
const MAX_REDIRECT_REQUESTS: usize = 10;

/// Go's error when a TLS handshake is answered by a plain HTTP server.
const HTTP_RESPONSE_TO_HTTPS: &str = "http: server gave HTTP response to HTTPS client";

/// Where a request goes: scheme, host, port and the path with its query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `http` or `https` (anything else fails when sent, as in Go).
    pub scheme: String,
    /// Host name or IP address, without brackets.
    pub host: String,
    pub port: u16,
    /// Path and query as sent (`/healthz?full=1`); empty means `/`.
    pub path: String,
}

impl Target {
    /// `host:port` (`[v6]:port`).
    #[must_use]
    pub fn authority(&self) -> String {
        format::join_host_port(&self.host, self.port)
    }

    /// The URL as Go prints it.
    #[must_use]
    pub fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority(), self.path)
    }

    fn request_target(&self) -> &str {
        if self.path.is_empty() { "/" } else { &self.path }
    }

    fn from_url(url: &url::Url) -> Self {
        let host = match url.host() {
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            Some(h) => h.to_string(),
            None => String::new(),
        };
        let mut path = url.path().to_string();
        if let Some(q) = url.query() {
            path.push('?');
            path.push_str(q);
        }
        Self { scheme: url.scheme().to_string(), host, port: url.port_or_known_default().unwrap_or(0), path }
    }
}

/// A `GET` as the kubelet sends it for a probe or hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGetRequest {
    pub target: Target,
    /// Header lines in order (names as written; `Host` is not among them).
    pub headers: Vec<(String, String)>,
    /// The `Host` header's value when the action sets one; else `host:port` is sent.
    pub host_header: Option<String>,
}

impl HttpGetRequest {
    /// Builds the request for `action` of `container` (upstream
    /// `NewRequestForHTTPGetAction`); `pod_ip` is the host when the action has none,
    /// `purpose` goes into the `User-Agent` (`probe` or `lifecycle`). Fails when the port
    /// cannot be resolved.
    pub fn for_action(
        action: &HTTPGetAction,
        container: &Container,
        pod_ip: &str,
        purpose: &str,
    ) -> Result<Self, String> {
        let scheme = action.scheme.as_deref().filter(|s| !s.is_empty()).unwrap_or("http").to_ascii_lowercase();
        let host = action.host.as_deref().filter(|h| !h.is_empty()).unwrap_or(pod_ip);
        let port = resolve_container_port(&action.port, container)?;
        let target = Target {
            scheme,
            host: host.to_string(),
            port,
            path: format_path(action.path.as_deref().unwrap_or_default()),
        };
        let mut headers: Vec<(String, String)> =
            action.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect();
        let has = |headers: &[(String, String)], name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        if !has(&headers, "user-agent") {
            headers.push(("User-Agent".into(), user_agent(purpose)));
        }
        if !has(&headers, "accept") {
            headers.push(("Accept".into(), "*/*".into()));
        } else if first(&headers, "accept").is_some_and(str::is_empty) {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case("accept"));
        }
        let host_header = first(&headers, "host").filter(|h| !h.is_empty()).map(str::to_string);
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case("host"));
        Ok(Self { target, headers, host_header })
    }
}

/// The first value of header `name` (Go's `Header.Get`).
fn first<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// The path and query of a probe's `path` as Go's `url.Parse(path)` keeps them: the
/// fragment is dropped, a scheme and host in it are replaced by the probe's, a missing
/// leading `/` is added, characters not allowed in a URL are percent-encoded.
fn format_path(path: &str) -> String {
    let path = path.split('#').next().unwrap_or_default();
    let path = match path.find("://") {
        Some(i) if is_scheme(&path[..i]) => strip_authority(&path[i + 3..]),
        _ if path.starts_with("//") => strip_authority(&path[2..]),
        _ => path,
    };
    let mut out = String::with_capacity(path.len() + 1);
    if !path.is_empty() && !path.starts_with('/') {
        out.push('/');
    }
    for b in path.bytes() {
        let allowed = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b);
        if allowed {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn is_scheme(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
}

/// What follows the authority of `host:port/path?query`.
fn strip_authority(rest: &str) -> &str {
    rest.find(['/', '?']).map_or("", |i| &rest[i..])
}

/// A response: its status, the URL that gave it, and the first 10 KiB of the body (or why
/// reading the body failed).
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub url: String,
    pub body: Result<Vec<u8>, String>,
}

/// A request that got no response, as Go's `url.Error`: `Get "<url>": <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Get {}: {message}", format::quote(.url))]
pub struct HttpError {
    pub url: String,
    pub message: String,
}

impl HttpError {
    fn new(url: impl Into<String>, message: impl Into<String>) -> Self {
        Self { url: url.into(), message: message.into() }
    }

    /// An HTTPS request that a plain HTTP server answered.
    #[must_use]
    pub fn is_http_response_to_https(&self) -> bool {
        self.message == HTTP_RESPONSE_TO_HTTPS
    }
}

/// The kubelet's HTTP client for probes and hooks (see the module docs).
#[derive(Clone)]
pub struct HttpClient {
    tls: Arc<ClientConfig>,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    #[must_use]
    pub fn new() -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default TLS versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(InsecureSkipVerify(provider)))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Self { tls: Arc::new(config) }
    }

    /// Sends `request`, following same-host redirects, within `timeout` (`None`: no limit,
    /// as the lifecycle hook client).
    pub async fn get(&self, request: &HttpGetRequest, timeout: Option<Duration>) -> Result<HttpResponse, HttpError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let initial = &request.target;
        let mut target = initial.clone();
        let mut host_header = request.host_header.clone().unwrap_or_else(|| initial.authority());
        let mut referer: Option<String> = None;
        let mut sent = 0usize;
        loop {
            sent += 1;
            let url = target.url();
            let exchange = self.exchange(&target, &host_header, referer.as_deref(), &request.headers);
            let (response, connection) = match within(deadline, exchange).await {
                Some(Ok(r)) => r,
                Some(Err(message)) => return Err(HttpError::new(url, message)),
                None => {
                    let message = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)";
                    return Err(HttpError::new(url, message));
                }
            };
            let status = response.status().as_u16();
            let location = matches!(status, 301 | 302 | 303 | 307 | 308)
                .then(|| response.headers().get(header::LOCATION))
                .flatten()
                .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned())
                .filter(|l| !l.is_empty());
            if let Some(location) = location {
                let next = url::Url::parse(&url).and_then(|base| base.join(&location)).map_err(|e| {
                    HttpError::new(&url, format!("failed to parse Location header {}: {e}", format::quote(&location)))
                })?;
                let next = Target::from_url(&next);
                // Upstream's redirect checker: another host ends the chain with this response.
                if next.host.eq_ignore_ascii_case(&initial.host) {
                    if sent >= MAX_REDIRECT_REQUESTS {
                        return Err(HttpError::new(location, "stopped after 10 redirects"));
                    }
                    drop(connection);
                    // Go keeps a custom Host only for a relative Location.
                    let relative = matches!(url::Url::parse(&location), Err(url::ParseError::RelativeUrlWithoutBase));
                    host_header = match &request.host_header {
                        Some(h) if relative => h.clone(),
                        _ => next.authority(),
                    };
                    referer = (!(target.scheme == "https" && next.scheme == "http")).then(|| url.clone());
                    target = next;
                    continue;
                }
            }
            let body = match within(deadline, read_body(response.into_body(), MAX_RESPONSE_BODY)).await {
                Some(body) => body,
                None => {
                    Err("context deadline exceeded (Client.Timeout or context cancellation while reading body)".into())
                }
            };
            drop(connection);
            return Ok(HttpResponse { status, url, body });
        }
    }

    /// One request on a new connection: connect (and TLS), send, wait for the headers.
    async fn exchange(
        &self,
        target: &Target,
        host_header: &str,
        referer: Option<&str>,
        headers: &[(String, String)],
    ) -> Result<(hyper::Response<Incoming>, Connection), String> {
        let https = match target.scheme.as_str() {
            "http" => false,
            "https" => true,
            other => return Err(format!("unsupported protocol scheme {}", format::quote(other))),
        };
        if target.host.is_empty() {
            return Err("http: no Host in request URL".into());
        }
        let mut request = hyper::Request::get(target.request_target())
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("net/http: invalid request URI: {e}"))?;
        let map = request.headers_mut();
        map.insert(
            header::HOST,
            HeaderValue::from_str(host_header).map_err(|_| "http: invalid Host header".to_string())?,
        );
        let mut user_agent_sent = false;
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("net/http: invalid header field name {}", format::quote(name)))?;
            if name == header::USER_AGENT {
                // Go sends the first User-Agent value only, and none when it is empty.
                if user_agent_sent || value.is_empty() {
                    user_agent_sent = true;
                    continue;
                }
                user_agent_sent = true;
            }
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("net/http: invalid header field value for {}", format::quote(name.as_str())))?;
            map.append(name, value);
        }
        if let Some(r) = referer
            && let Ok(v) = HeaderValue::from_str(r)
        {
            map.insert(header::REFERER, v);
        }
        map.insert(header::CONNECTION, HeaderValue::from_static("close"));

        let tcp = tcp::dial(&target.host, target.port).await?;
        let io: Box<dyn Io> = if https { Box::new(self.tls_connect(&target.host, tcp).await?) } else { Box::new(tcp) };
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .title_case_headers(true)
            .handshake::<_, Empty<Bytes>>(TokioIo::new(io))
            .await
            .map_err(|e| hyper_error(&e))?;
        let connection = Connection(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let response = sender.send_request(request).await.map_err(|e| hyper_error(&e))?;
        Ok((response, connection))
    }

    async fn tls_connect(
        &self,
        host: &str,
        tcp: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<FirstBytes<tokio::net::TcpStream>>, String> {
        let name = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_string()).map_err(|e| format!("tls: {e}"))?,
        };
        let seen = Arc::new(Mutex::new(Vec::with_capacity(5)));
        let stream = FirstBytes { inner: tcp, seen: seen.clone() };
        match tokio_rustls::TlsConnector::from(self.tls.clone()).connect(name, stream).await {
            Ok(tls) => Ok(tls),
            Err(_) if seen.lock().expect("first bytes lock").starts_with(b"HTTP/") => {
                Err(HTTP_RESPONSE_TO_HTTPS.into())
            }
            Err(e) => Err(format!("tls: {e}")),
        }
    }
}

/// A connection's driver task, ended when the response is done with.
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `fut` until `deadline` (if any); `None` when the deadline passed.
async fn within<T>(deadline: Option<Instant>, fut: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// Reads at most `limit` bytes of the body (upstream `ReadAtMost`; the rest is not read).
async fn read_body(mut body: Incoming, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while out.len() < limit {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            Some(Err(e)) if e.is_incomplete_message() => return Err("unexpected EOF".into()),
            Some(Err(e)) => return Err(e.to_string()),
        }
    }
    out.truncate(limit);
    Ok(out)
}

/// Go's wording for a failed exchange (`EOF` when the server closed the connection).
fn hyper_error(e: &hyper::Error) -> String {
    if e.is_incomplete_message() {
        return "EOF".into();
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return format!("read: {}", format::io_error(io));
        }
        source = s.source();
    }
    e.to_string()
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Records the first five bytes read, to tell an HTTP answer to a TLS handshake (Go
/// checks the TLS record header for `HTTP/`).
#[derive(Debug)]
pub(crate) struct FirstBytes<S> {
    inner: S,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstBytes<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if poll.is_ready() {
            let mut seen = self.seen.lock().expect("first bytes lock");
            if seen.len() < 5 {
                let new = &buf.filled()[before..];
                let take = new.len().min(5 - seen.len());
                seen.extend_from_slice(&new[..take]);
            }
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstBytes<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Go's `InsecureSkipVerify`: any certificate is accepted; the handshake signature is
/// still checked against the presented certificate.
#[derive(Debug)]
struct InsecureSkipVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for InsecureSkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Runs HTTP probes (upstream `httpprobe` with `followNonLocalRedirects` off, as the
/// kubelet builds it).
#[derive(Debug, Clone, Default)]
pub struct HttpProber {
    client: HttpClient,
}

impl HttpProber {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Probes with `request` within `timeout` (upstream `DoHTTPProbe`).
    pub async fn probe(&self, request: &HttpGetRequest, timeout: Duration) -> ProbeResponse {
        let response = match self.client.get(request, Some(timeout)).await {
            Ok(r) => r,
            Err(e) => return Ok(Outcome::failure(e.to_string())),
        };
        let body = match response.body {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(message) => return Err(ProbeError { result: ProbeResult::Failure, message }),
        };
        let status = response.status;
        tracing::trace!(url = %response.url, status, "HTTP probe response");
        Ok(match status {
            200..=299 => Outcome::success(body),
            300..=399 => {
                Outcome::new(ProbeResult::Warning, format!("Probe terminated redirects, Response body: {body}"))
            }
            _ => Outcome::failure(format!("HTTP probe failed with statuscode: {status}")),
        })
    }
}

#[cfg(test)]
mod tests;
