//! `tracing.endpoint`: where the OTLP gRPC exporter connects, in gRPC's naming syntax as
//! upstream validates it (component-base `tracing/api/v1` `validateEndpoint`).
//!
//! - `host:port` (no scheme; upstream "none", read as `dns://host:port`), `dns:///host:port`
//!   and `dns://authority/host:port`: plain-text gRPC over TCP. A missing port is 443, as
//!   in gRPC.
//! - `unix:///absolute/path`: plain-text gRPC over a unix socket.
//! - `unix-abstract://name`: a Linux abstract socket (upstream's validation reads a form
//!   without "//" as a DNS name, so it needs the slashes).
//! - swiftlet only: `http://host:port` (plain text) and `https://host:port` (TLS, verified
//!   against the system's trusted roots). Upstream refuses these schemes and always
//!   dials without TLS.

use std::path::PathBuf;

use http::Uri;

/// The endpoint when `tracing` is set without one (upstream's OTLP default).
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";

/// gRPC's default port when a `dns` target names none.
const GRPC_DEFAULT_PORT: u16 = 443;

/// A parsed `tracing.endpoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CollectorEndpoint {
    /// TCP: `uri` is `http://host:port` or `https://host:port`.
    Tcp {
        /// The URI tonic dials.
        uri: String,
        /// TLS (only for an `https://` endpoint).
        tls: bool,
    },
    /// A unix socket path.
    Unix(PathBuf),
    /// A Linux abstract socket name (without the leading NUL).
    UnixAbstract(String),
}

impl CollectorEndpoint {
    /// Parses `endpoint` as upstream validates it; the error is the message that follows
    /// `tracing.endpoint: ` (Go's `field.Invalid` wording).
    pub fn parse(endpoint: &str) -> Result<Self, String> {
        // As upstream: without "//" the endpoint is a bare target resolved by DNS.
        let text = if endpoint.contains("//") { endpoint.to_owned() } else { format!("dns://{endpoint}") };
        let invalid = |why: &dyn std::fmt::Display| format!("Invalid value: {text:?}: {why}");
        let url = url::Url::parse(&text).map_err(|e| invalid(&e))?;
        let scheme = url.scheme().to_owned();
        let rest = &text[scheme.len() + 1..];
        match scheme.as_str() {
            "dns" => {
                // dns:[//authority/]host[:port]; the authority (a DNS server) is ignored.
                let target = match rest.strip_prefix("//") {
                    Some(after) => match after.split_once('/') {
                        Some((_authority, target)) => target,
                        None => after,
                    },
                    None => rest,
                };
                Ok(Self::Tcp {
                    uri: host_port_uri("http", target, GRPC_DEFAULT_PORT).map_err(|e| invalid(&e))?,
                    tls: false,
                })
            }
            "http" | "https" => {
                let target = rest.strip_prefix("//").unwrap_or(rest).trim_end_matches('/');
                let default_port = if scheme == "https" { 443 } else { 80 };
                let uri = host_port_uri(&scheme, target, default_port).map_err(|e| invalid(&e))?;
                Ok(Self::Tcp { uri, tls: scheme == "https" })
            }
            "unix" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if !path.starts_with('/') {
                    return Err(invalid(&"the unix socket path must be absolute (unix:///path)"));
                }
                Ok(Self::Unix(PathBuf::from(path)))
            }
            "unix-abstract" => {
                let name = rest.strip_prefix("//").unwrap_or(rest);
                if name.is_empty() {
                    return Err(invalid(&"the abstract socket name is empty"));
                }
                Ok(Self::UnixAbstract(name.to_owned()))
            }
            other => Err(invalid(&format_args!(
                "unsupported scheme: {other}.  Options are none, dns, unix, or unix-abstract.  See \
                 https://github.com/grpc/grpc/blob/master/doc/naming.md (swiftlet also accepts http \
                 and https)"
            ))),
        }
    }
}

impl std::fmt::Display for CollectorEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp { uri, .. } => f.write_str(uri),
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::UnixAbstract(name) => write!(f, "unix-abstract://{name}"),
        }
    }
}

/// `scheme://host:port` from a `host[:port]` target.
fn host_port_uri(scheme: &str, target: &str, default_port: u16) -> Result<String, String> {
    if target.is_empty() {
        return Err("missing the host".to_owned());
    }
    let uri: Uri = format!("{scheme}://{target}").parse().map_err(|e: http::uri::InvalidUri| e.to_string())?;
    let host = uri.host().filter(|h| !h.is_empty()).ok_or("missing the host")?;
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err(format!("unexpected path {:?} after host:port", uri.path()));
    }
    Ok(format!("{scheme}://{host}:{}", uri.port_u16().unwrap_or(default_port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(uri: &str) -> CollectorEndpoint {
        CollectorEndpoint::Tcp { uri: uri.to_owned(), tls: uri.starts_with("https") }
    }

    #[test]
    fn endpoints_in_grpc_naming() {
        let ok = [
            ("localhost:4317", tcp("http://localhost:4317")),
            ("10.0.0.7:4317", tcp("http://10.0.0.7:4317")),
            ("[::1]:4317", tcp("http://[::1]:4317")),
            ("collector.monitoring", tcp("http://collector.monitoring:443")),
            ("dns:///collector:4317", tcp("http://collector:4317")),
            ("dns://8.8.8.8/collector:4317", tcp("http://collector:4317")),
            ("http://collector:4317", tcp("http://collector:4317")),
            ("https://collector.example:4317/", tcp("https://collector.example:4317")),
            ("https://collector.example", tcp("https://collector.example:443")),
            ("unix:///run/otel.sock", CollectorEndpoint::Unix("/run/otel.sock".into())),
            ("unix-abstract://otel", CollectorEndpoint::UnixAbstract("otel".into())),
        ];
        for (text, want) in ok {
            assert_eq!(CollectorEndpoint::parse(text), Ok(want), "{text}");
        }
        assert_eq!(CollectorEndpoint::parse(DEFAULT_ENDPOINT), Ok(tcp("http://localhost:4317")));
    }

    #[test]
    fn bad_endpoints_say_why_as_upstream() {
        let err = CollectorEndpoint::parse("ftp://collector:21").unwrap_err();
        assert!(
            err.starts_with(
                "Invalid value: \"ftp://collector:21\": unsupported scheme: ftp.  Options are none, \
                 dns, unix, or unix-abstract."
            ),
            "{err}"
        );
        // Without "//" the value is shown as upstream shows it: with the dns:// prefix.
        let err = CollectorEndpoint::parse("collector:port").unwrap_err();
        assert!(err.starts_with("Invalid value: \"dns://collector:port\": "), "{err}");
        assert!(CollectorEndpoint::parse("unix://relative.sock").unwrap_err().contains("absolute"));
        assert!(CollectorEndpoint::parse("dns:///").unwrap_err().contains("missing the host"));
        assert!(CollectorEndpoint::parse("http://collector:4317/v1/traces").unwrap_err().contains("path"));
    }

    #[test]
    fn display_round_trips_what_is_dialled() {
        for text in ["http://collector:4317", "unix:///run/otel.sock", "unix-abstract://otel"] {
            let endpoint = CollectorEndpoint::parse(text).unwrap();
            assert_eq!(CollectorEndpoint::parse(&endpoint.to_string()), Ok(endpoint), "{text}");
        }
    }
}
