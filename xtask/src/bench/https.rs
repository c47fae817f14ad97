//! A keep-alive HTTPS client for benchmarks: `openssl s_client` holds one TLS connection
//! (to the agent, or with a client certificate to the test bed's kube-apiserver) and the
//! bench speaks HTTP/1.1 through its stdin and stdout.
//!
//! Why not `curl` per request (as [`super::agent::http_get`]): every request would pay a
//! new process and a new TLS handshake, and the agent's handshake CPU would be counted as
//! the scrape's. A scraper such as Prometheus keeps its connection open, so the cost of a
//! scrape is the request on an established connection; so does a controller's client of
//! the API server. xtask has no TLS stack of its own (it must build before anything is
//! installed, see its `Cargo.toml`), hence the tunnel.
//!
//! The HTTP/1.1 reader handles what the servers send: `Content-Length` bodies, chunked
//! bodies and bodies ended by closing the connection; 1xx responses are skipped.

use std::{path::PathBuf, process::Stdio};

use anyhow::{Context as _, Result, bail, ensure};
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    process::{Child, ChildStdin, ChildStdout},
    task::JoinHandle,
};

/// Longest response head (status line and headers) accepted.
const MAX_HEAD: usize = 64 * 1024;

/// One HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The server closes the connection after this response.
    pub closes: bool,
}

impl Response {
    /// The first header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// A `GET` request for `path` on a kept-alive connection, without `Accept` and
/// `Accept-Encoding`: the server's defaults (Prometheus text 0.0.4, identity).
pub fn get_request(host: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: swiftlet-xtask-bench\r\n\r\n")
}

/// Status code and headers (names lower-cased) of a response head: the status line and
/// the header lines, without the empty line that ends the head.
pub fn parse_head(head: &str) -> Result<(u16, Vec<(String, String)>)> {
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let status_line = lines.next().context("empty response head")?;
    let mut words = status_line.splitn(3, ' ');
    let version = words.next().unwrap_or_default();
    ensure!(version.starts_with("HTTP/1."), "not an HTTP/1.x status line: {status_line:?}");
    let status: u16 = words
        .next()
        .and_then(|c| c.parse().ok())
        .filter(|c| (100..1000).contains(c))
        .with_context(|| format!("no status code in {status_line:?}"))?;
    let headers = lines
        .map(|l| {
            let (name, value) = l.split_once(':').with_context(|| format!("malformed header line {l:?}"))?;
            Ok((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((status, headers))
}

/// How a response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(usize),
    Chunked,
    /// Read until the server closes the connection.
    UntilClose,
}

/// The values of header `name` (lower case).
fn values<'a>(headers: &'a [(String, String)], name: &'a str) -> impl Iterator<Item = &'a str> {
    headers.iter().filter(move |(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The body's framing from the headers (RFC 9112 §6.3): chunked wins over a length; 1xx,
/// 204 and 304 have no body.
pub fn framing(status: u16, headers: &[(String, String)]) -> Result<Framing> {
    if (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(Framing::Length(0));
    }
    if values(headers, "transfer-encoding").flat_map(|v| v.split(',')).any(|c| c.trim().eq_ignore_ascii_case("chunked"))
    {
        return Ok(Framing::Chunked);
    }
    match values(headers, "content-length").next() {
        Some(n) => Ok(Framing::Length(n.parse().with_context(|| format!("content-length {n:?}"))?)),
        None => Ok(Framing::UntilClose),
    }
}

/// Reads one line ending in `\n` (at most `MAX_HEAD` bytes); `None` at end of input.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<String>> {
    let mut line = Vec::new();
    let n = (&mut *r).take(MAX_HEAD as u64).read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Ok(None);
    }
    ensure!(line.ends_with(b"\n"), "line longer than {MAX_HEAD} bytes or cut off by the end of the connection");
    Ok(Some(String::from_utf8(line).context("response head is not UTF-8")?))
}

/// Reads a response head; `None` if the connection ended before its first byte.
async fn read_head<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<String>> {
    let mut head = String::new();
    loop {
        let Some(line) = read_line(r).await? else {
            if head.is_empty() {
                return Ok(None);
            }
            bail!("the connection ended inside a response head: {head:?}");
        };
        if line == "\r\n" || line == "\n" {
            if head.is_empty() {
                // Tolerate stray empty lines before a status line (RFC 9112 §2.2).
                continue;
            }
            return Ok(Some(head));
        }
        head.push_str(line.trim_end_matches(['\r', '\n']));
        head.push_str("\r\n");
        ensure!(head.len() <= MAX_HEAD, "response head longer than {MAX_HEAD} bytes");
    }
}

/// Appends a chunked body (RFC 9112 §7.1) to `body`; trailers are read and dropped.
async fn read_chunked<R: AsyncBufRead + Unpin>(r: &mut R, body: &mut Vec<u8>) -> Result<()> {
    loop {
        let line = read_line(r).await?.context("the connection ended before the last chunk")?;
        let size = line.trim_end().split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).with_context(|| format!("chunk size {line:?}"))?;
        if size == 0 {
            loop {
                let trailer = read_line(r).await?.context("the connection ended inside the trailers")?;
                if trailer.trim_end().is_empty() {
                    return Ok(());
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).await.context("the connection ended inside a chunk")?;
        let end = read_line(r).await?.context("the connection ended after a chunk")?;
        ensure!(end.trim_end().is_empty(), "chunk not followed by CRLF: {end:?}");
    }
}

/// Reads one complete response (skipping 1xx ones); `None` if the connection ended
/// before it began (a server closing an idle connection).
pub async fn read_response<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Response>> {
    loop {
        let Some(head) = read_head(r).await? else { return Ok(None) };
        let (status, headers) = parse_head(&head)?;
        if (100..200).contains(&status) {
            continue;
        }
        let mut body = Vec::new();
        let framing = framing(status, &headers)?;
        match framing {
            Framing::Length(n) => {
                body.resize(n, 0);
                r.read_exact(&mut body)
                    .await
                    .with_context(|| format!("the connection ended inside a {n}-byte body"))?;
            }
            Framing::Chunked => read_chunked(r, &mut body).await?,
            Framing::UntilClose => {
                r.read_to_end(&mut body).await?;
            }
        }
        let closes = framing == Framing::UntilClose
            || headers
                .iter()
                .any(|(n, v)| n == "connection" && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
        return Ok(Some(Response { status, headers, body, closes }));
    }
}

/// A verified TLS client: the CA the server's certificate must chain to, and the client
/// certificate and key presented (the test bed's cluster admin, say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `openssl s_client`'s arguments for `host` (`ip:port`): without `tls` the server's
/// certificate is not verified (as `curl -k`); with it, it must chain to `tls.ca` and name
/// the host's IP address, and the client certificate is presented.
pub fn s_client_args(host: &str, tls: Option<&ClientTls>) -> Vec<String> {
    // -quiet: no session or certificate output, and stdin's end does not close the
    // connection (-ign_eof); lines are never taken as commands.
    let mut args: Vec<String> =
        ["s_client", "-connect", host, "-quiet", "-verify_quiet", "-alpn", "http/1.1"].map(str::to_owned).into();
    if let Some(tls) = tls {
        args.extend(["-verify_return_error".to_owned(), "-CAfile".to_owned(), tls.ca.display().to_string()]);
        if let Some((ip, _)) = host.rsplit_once(':') {
            args.extend(["-verify_ip".to_owned(), ip.trim_matches(['[', ']']).to_owned()]);
        }
        args.extend([
            "-cert".to_owned(),
            tls.cert.display().to_string(),
            "-key".to_owned(),
            tls.key.display().to_string(),
        ]);
    }
    args
}

/// An HTTPS connection to a host through `openssl s_client` (see [`s_client_args`]).
#[derive(Debug)]
pub struct Tunnel {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Option<JoinHandle<String>>,
    host: String,
    closed: bool,
}

impl Tunnel {
    /// Starts `openssl s_client` to `127.0.0.1:port` without verifying the server (the
    /// agent's certificate is self-signed); the TLS handshake happens before the first
    /// request is answered, so a caller that times requests should send an unmeasured one
    /// first.
    pub fn open(port: u16) -> Result<Self> {
        Self::connect(&format!("127.0.0.1:{port}"), None)
    }

    /// Starts `openssl s_client` to `host` (`ip:port`), verified and with a client
    /// certificate when `tls` is given.
    pub fn connect(host: &str, tls: Option<&ClientTls>) -> Result<Self> {
        let mut child = tokio::process::Command::new("openssl")
            .args(s_client_args(host, tls))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("running openssl s_client (apt package openssl)")?;
        let stdin = child.stdin.take().context("openssl stdin")?;
        let stdout = BufReader::with_capacity(256 * 1024, child.stdout.take().context("openssl stdout")?);
        let stderr = child.stderr.take().map(|mut e| {
            tokio::spawn(async move {
                let mut s = String::new();
                let _ = e.read_to_string(&mut s).await;
                s
            })
        });
        Ok(Self { child, stdin, stdout, stderr, host: host.to_owned(), closed: false })
    }

    /// `GET path` on the connection: the complete response, or `None` if the server had
    /// closed the connection before answering (open a new tunnel then).
    pub async fn get(&mut self, path: &str) -> Result<Option<Response>> {
        let request = get_request(&self.host, path);
        self.exchange(request.as_bytes()).await.with_context(|| format!("GET https://{}{path}", self.host))
    }

    /// Sends one complete request (`bytes`) and reads its response: `None` if the server
    /// had closed the connection before answering (open a new tunnel then).
    pub async fn exchange(&mut self, bytes: &[u8]) -> Result<Option<Response>> {
        if self.closed {
            return Ok(None);
        }
        if self.stdin.write_all(bytes).await.is_err() {
            // openssl is gone: the connection is closed (or never opened; see `close`).
            self.closed = true;
            return Ok(None);
        }
        if self.stdin.flush().await.is_err() {
            self.closed = true;
            return Ok(None);
        }
        let response = read_response(&mut self.stdout).await;
        match &response {
            Ok(Some(r)) if !r.closes => {}
            _ => self.closed = true,
        }
        response
    }

    /// Stops openssl; returns what it printed on stderr (why a connection failed).
    pub async fn close(mut self) -> String {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        match self.stderr.take() {
            Some(h) => h.await.unwrap_or_default().trim().to_owned(),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    fn read(bytes: &[u8]) -> Result<Option<Response>> {
        block_on(read_response(&mut BufReader::new(bytes)))
    }

    #[test]
    fn requests_are_minimal_http11_gets() {
        assert_eq!(
            get_request("127.0.0.1:10250", "/metrics/cadvisor"),
            "GET /metrics/cadvisor HTTP/1.1\r\nHost: 127.0.0.1:10250\r\nUser-Agent: swiftlet-xtask-bench\r\n\r\n"
        );
    }

    #[test]
    fn s_client_verifies_and_presents_a_certificate_only_when_told() {
        let plain = s_client_args("127.0.0.1:10250", None);
        assert_eq!(plain[..3], ["s_client", "-connect", "127.0.0.1:10250"]);
        assert!(!plain.iter().any(|a| a.starts_with("-verify_return_error") || a == "-cert"), "{plain:?}");
        let tls = ClientTls { ca: "/pki/ca.crt".into(), cert: "/pki/admin.crt".into(), key: "/pki/admin.key".into() };
        let verified = s_client_args("127.0.0.1:6443", Some(&tls)).join(" ");
        assert!(
            verified.ends_with(
                "-verify_return_error -CAfile /pki/ca.crt -verify_ip 127.0.0.1 -cert /pki/admin.crt -key /pki/admin.key"
            ),
            "{verified}"
        );
    }

    #[test]
    fn heads_parse_with_lower_case_names() {
        let (status, headers) =
            parse_head("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length:  12 \r\n")
                .unwrap();
        assert_eq!(status, 200);
        assert_eq!(headers[0], ("content-type".to_owned(), "text/plain; version=0.0.4".to_owned()));
        assert_eq!(headers[1], ("content-length".to_owned(), "12".to_owned()));
        assert_eq!(parse_head("HTTP/1.0 404\r\n").unwrap().0, 404);
        assert!(parse_head("SSH-2.0-OpenSSH\r\n").is_err());
        assert!(parse_head("HTTP/1.1 abc OK\r\n").is_err());
        assert!(parse_head("HTTP/1.1 200 OK\r\nno colon\r\n").is_err());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect()
        };
        assert_eq!(framing(200, &h(&[("content-length", "5")])).unwrap(), Framing::Length(5));
        assert_eq!(
            framing(200, &h(&[("content-length", "5"), ("transfer-encoding", "gzip, Chunked")])).unwrap(),
            Framing::Chunked
        );
        assert_eq!(framing(200, &[]).unwrap(), Framing::UntilClose);
        assert_eq!(framing(204, &[]).unwrap(), Framing::Length(0));
        assert_eq!(framing(304, &h(&[("content-length", "5")])).unwrap(), Framing::Length(0));
        assert!(framing(200, &h(&[("content-length", "x")])).is_err());
    }

    #[test]
    fn reads_length_and_chunked_bodies_on_one_connection() {
        let wire = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello\
                     HTTP/1.1 100 Continue\r\n\r\n\
                     HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                     4;ext=1\r\nwiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nx-trailer: y\r\n\r\n\
                     HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let responses = block_on(async {
            let mut r = BufReader::new(&wire[..]);
            let mut out = Vec::new();
            while let Some(resp) = read_response(&mut r).await.unwrap() {
                out.push(resp);
            }
            out
        });
        assert_eq!(responses.len(), 3);
        assert_eq!(
            (responses[0].status, responses[0].body.as_slice(), responses[0].closes),
            (200, &b"hello"[..], false)
        );
        assert_eq!(responses[1].body, b"wikipedia in \r\n\r\nchunks.");
        assert_eq!(responses[1].header("transfer-encoding"), Some("chunked"));
        assert!(!responses[1].closes);
        assert_eq!((responses[2].status, responses[2].body.len(), responses[2].closes), (404, 0, true));
    }

    #[test]
    fn a_body_without_length_ends_with_the_connection() {
        let r = read(b"HTTP/1.0 200 OK\r\n\r\nall of it").unwrap().unwrap();
        assert_eq!((r.body.as_slice(), r.closes), (&b"all of it"[..], true));
    }

    #[test]
    fn a_closed_connection_is_none_and_a_cut_response_an_error() {
        assert_eq!(read(b"").unwrap(), None);
        assert!(read(b"HTTP/1.1 200 OK\r\nContent-Le").is_err());
        assert!(read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").is_err());
        assert!(read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc").is_err());
        assert!(read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n").is_err());
        assert!(read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
    }
}
