//! The channel to the OTLP collector at a [`CollectorEndpoint`] (parsed in the `types`
//! leaf, where config validation checks `tracing.endpoint` too).

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Uri};

use crate::types::collector_endpoint::CollectorEndpoint;

/// How long a connection attempt to the collector may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A lazily connecting channel to the collector: building it never fails because the
/// collector is down, and a collector that comes back is reconnected on its own. Must be
/// called within a tokio runtime.
pub fn channel(endpoint: &CollectorEndpoint, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    match endpoint {
        CollectorEndpoint::Tcp { uri, tls } => {
            let mut endpoint = Endpoint::from_shared(uri.clone())?.connect_timeout(CONNECT_TIMEOUT).timeout(timeout);
            if *tls {
                endpoint = endpoint.tls_config(ClientTlsConfig::new().with_native_roots())?;
            }
            Ok(endpoint.connect_lazy())
        }
        CollectorEndpoint::Unix(path) => {
            let path = path.clone();
            Ok(local_endpoint(timeout).connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { tokio::net::UnixStream::connect(path).await.map(TokioIo::new) }
            })))
        }
        CollectorEndpoint::UnixAbstract(name) => {
            let name = name.clone();
            Ok(local_endpoint(timeout).connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let name = name.clone();
                async move { connect_abstract(&name).map(TokioIo::new) }
            })))
        }
    }
}

/// The (ignored) URI of a socket-file channel; tonic needs a syntactically valid one.
fn local_endpoint(timeout: Duration) -> Endpoint {
    Endpoint::from_static("http://otel-collector.invalid").connect_timeout(CONNECT_TIMEOUT).timeout(timeout)
}

/// Connects to a Linux abstract unix socket (connecting to a local socket does not block).
fn connect_abstract(name: &str) -> std::io::Result<tokio::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt as _;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    stream.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(stream)
}
