//! A client for the event API over its unix socket: for tests, tools and other
//! node-local Rust programs.

use std::path::Path;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::proto::node_events_client::NodeEventsClient;
use super::{Error, Result};

/// Connects to the event API listening on `socket`.
///
/// ```no_run
/// use swiftlet::event_api::{client, default_socket, proto};
///
/// # async fn watch() -> anyhow::Result<()> {
/// let socket = default_socket(std::path::Path::new("/var/lib/kubelet"));
/// let mut events = client::connect(&socket).await?;
/// let request = proto::WatchRequest { namespaces: vec!["default".into()], ..Default::default() };
/// let mut stream = events.watch(request).await?.into_inner();
/// while let Some(ev) = stream.message().await? {
///     println!("{:?} {}/{} {} exit={:?}", ev.kind(), ev.pod_namespace, ev.pod_name, ev.container_name, ev.exit_code);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn connect(socket: &Path) -> Result<NodeEventsClient<Channel>> {
    let path = socket.to_owned();
    // The URI is ignored by the connector; tonic needs a syntactically valid one.
    let channel = Endpoint::from_static("http://swiftlet-events.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| Error::Connect { path: socket.to_owned(), source })?;
    Ok(NodeEventsClient::new(channel))
}
