//! Clients of the kubelet's streaming endpoints, speaking what kubectl and the API server
//! speak: an HTTP/1.1 upgrade over TLS, then the WebSocket channel protocols
//! (`v5.channel.k8s.io` / `v4.channel.k8s.io`: each binary message is a channel byte and
//! data; v5 adds the close signal `255 <channel>`), written here from RFC 6455 and
//! `k8s.io/apimachinery/pkg/util/httpstream/wsstream`. The SPDY/3.1 client (the API
//! server's protocol to the kubelet) is [`crate::spdy`], on the same [`upgrade`].

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The upgraded connection.
pub type Conn = BufReader<TlsStream<TcpStream>>;

/// A verifier that accepts the agent's self-signed certificate.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The response to an upgrade request: status, headers (names lower-cased), and the
/// connection (upgraded when the status is 101; else the body follows).
pub struct Upgraded {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub conn: Conn,
}

impl std::fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgraded").field("status", &self.status).field("headers", &self.headers).finish_non_exhaustive()
    }
}

impl Upgraded {
    /// The first value of header `name` (lower case), or "".
    #[must_use]
    pub fn header(&self, name: &str) -> &str {
        self.headers.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
    }

    /// The body of a refusal (read until the server closes, at most 5 s).
    pub async fn body(mut self) -> String {
        let mut body = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.conn.read_to_end(&mut body)).await;
        String::from_utf8_lossy(&body).into_owned()
    }
}

/// Sends `method path` over TLS to `addr` (host, port: the agent's
/// [`crate::Agent::https_addr`]) with `headers` (plus `Host` and `Connection: Upgrade`)
/// and reads the response head.
pub async fn upgrade(addr: (&str, u16), method: &str, path: &str, headers: &[(&str, &str)]) -> Result<Upgraded> {
    let (host, port) = addr;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    let mut conn = BufReader::new(tls);
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\n");
    for (k, v) in headers {
        let _ = write!(head, "{k}: {v}\r\n");
    }
    head.push_str("Content-Length: 0\r\n\r\n");
    conn.write_all(head.as_bytes()).await?;
    conn.flush().await?;
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    let status = line.split(' ').nth(1).context("no status line")?.parse()?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        conn.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').context("bad header line")?;
        headers.push((k.to_ascii_lowercase(), v.trim().to_owned()));
    }
    Ok(Upgraded { status, headers, conn })
}

/// A WebSocket connection with the Kubernetes channel protocol.
pub struct WsChannels {
    conn: Conn,
    /// The negotiated subprotocol.
    pub protocol: String,
}

impl std::fmt::Debug for WsChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsChannels").field("protocol", &self.protocol).finish_non_exhaustive()
    }
}

/// The channels of remote command protocols.
pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5: `255 <channel>` closes a channel (stdin's EOF).
pub const CLOSE: u8 = 255;

impl WsChannels {
    /// Opens a WebSocket to `path`, offering `protocols` in order. Fails with the status
    /// and body when the server does not upgrade.
    pub async fn connect(addr: (&str, u16), path: &str, protocols: &[&str]) -> Result<Self> {
        let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
        let offered = protocols.join(", ");
        let up = upgrade(
            addr,
            "GET",
            path,
            &[
                ("Upgrade", "websocket"),
                ("Sec-WebSocket-Version", "13"),
                ("Sec-WebSocket-Key", &key),
                ("Sec-WebSocket-Protocol", &offered),
            ],
        )
        .await?;
        if up.status != 101 {
            let status = up.status;
            bail!("no upgrade: {status} {}", up.body().await);
        }
        let protocol = up.header("sec-websocket-protocol").to_owned();
        ensure!(up.header("sec-websocket-accept").len() == 28, "no Sec-WebSocket-Accept: {:?}", up.headers);
        Ok(Self { conn: up.conn, protocol })
    }

    /// Sends one binary message: `channel` then `data` (masked, as a client must).
    pub async fn send(&mut self, channel: u8, data: &[u8]) -> Result<()> {
        let mut payload = Vec::with_capacity(data.len() + 1);
        payload.push(channel);
        payload.extend_from_slice(data);
        self.send_frame(0x2, &payload).await
    }

    /// v5 only: closes `channel` (stdin's EOF).
    pub async fn close_channel(&mut self, channel: u8) -> Result<()> {
        self.send_frame(0x2, &[CLOSE, channel]).await
    }

    async fn send_frame(&mut self, opcode: u8, payload: &[u8]) -> Result<()> {
        let mut frame = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0xfe);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0xff);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask: [u8; 4] = rand::random();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.conn.write_all(&frame).await?;
        self.conn.flush().await?;
        Ok(())
    }

    /// The next data message as (channel, data); `None` when the server closed. Pings are
    /// answered.
    pub async fn recv(&mut self) -> Result<Option<(u8, Vec<u8>)>> {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            match self.conn.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let len = match head[1] & 0x7f {
                126 => u64::from(self.conn.read_u16().await?),
                127 => self.conn.read_u64().await?,
                n => u64::from(n),
            };
            let mut mask = [0u8; 4];
            if masked {
                self.conn.read_exact(&mut mask).await?;
            }
            let mut payload = vec![0u8; usize::try_from(len)?];
            self.conn.read_exact(&mut payload).await?;
            if masked {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= mask[i % 4];
                }
            }
            match opcode {
                0x8 => return Ok(None),
                0x9 => self.send_frame(0xa, &payload).await?,
                0xa => {}
                _ => {
                    message.extend_from_slice(&payload);
                    if fin {
                        if message.is_empty() {
                            message.clear();
                            continue;
                        }
                        let channel = message[0];
                        return Ok(Some((channel, message[1..].to_vec())));
                    }
                }
            }
        }
    }

    /// Reads stdout until it contains `want` (other channels are skipped); fails after
    /// `timeout` or when the server closes first, with what stdout had.
    pub async fn stdout_until(&mut self, want: &str, timeout: Duration) -> Result<String> {
        let mut stdout = String::new();
        tokio::time::timeout(timeout, async {
            while !stdout.contains(want) {
                match self.recv().await? {
                    Some((STDOUT, d)) => stdout.push_str(&String::from_utf8_lossy(&d)),
                    Some(_) => {}
                    None => bail!("closed before {want:?} on stdout; stdout {stdout:?}"),
                }
            }
            Ok(())
        })
        .await
        .with_context(|| format!("no {want:?} on stdout in {timeout:?}"))??;
        Ok(stdout)
    }

    /// Reads until the server closes: what came on each channel, in order.
    pub async fn collect(&mut self, timeout: Duration) -> Result<Collected> {
        let mut out = Collected::default();
        tokio::time::timeout(timeout, async {
            while let Some((channel, data)) = self.recv().await? {
                out.add(channel, &data);
            }
            Ok::<_, anyhow::Error>(())
        })
        .await
        .context("the stream did not end in time")??;
        Ok(out)
    }
}

/// What a remote command wrote.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    pub stdout: String,
    pub stderr: String,
    /// The error channel: a `v1.Status` in JSON (v4+).
    pub error: String,
    /// Other channels (port forwarding: data and error channels of each port).
    pub other: std::collections::BTreeMap<u8, Vec<u8>>,
}

impl Collected {
    fn add(&mut self, channel: u8, data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        match channel {
            STDOUT => self.stdout.push_str(&text),
            STDERR => self.stderr.push_str(&text),
            ERROR => self.error.push_str(&text),
            other => self.other.entry(other).or_default().extend_from_slice(data),
        }
    }

    /// The exit code the error channel reports (upstream's `v1.Status`: `Success`, or
    /// `NonZeroExitCode` with an `ExitCode` cause).
    pub fn exit_code(&self) -> Result<i32> {
        exit_code(&self.error)
    }
}

/// The exit code in a remote command's status document.
pub fn exit_code(status: &str) -> Result<i32> {
    let v: Value = serde_json::from_str(status).with_context(|| format!("status {status:?}"))?;
    if v["status"] == "Success" {
        return Ok(0);
    }
    ensure!(v["reason"] == "NonZeroExitCode", "failure: {status}");
    let code = v["details"]["causes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["reason"] == "ExitCode"))
        .and_then(|c| c["message"].as_str())
        .context("no ExitCode cause")?;
    Ok(code.parse()?)
}
