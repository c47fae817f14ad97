//! The gRPC server of the event API: owns the unix socket file (stale-file cleanup,
//! permissions, removal on shutdown) and serves `NodeEvents.Watch` from the
//! [`EventBus`], filtered server-side.
//!
//! Each `Watch` call is one bus [`Subscription`](super::Subscription) driven as a stream
//! whose states are:
//! - *streaming*: forward each event the request's filter matches, in publish order;
//! - *lagged* (terminal): the client read too slowly and the bus ring wrapped around it.
//!   The stream ends with `RESOURCE_EXHAUSTED: client too slow, N events dropped`.
//!   Ending rather than skipping ahead is deliberate: a watcher that silently misses a
//!   `CONTAINER_DIED` holds a wrong picture of the node, so it must re-sync and re-watch,
//!   as with an expired Kubernetes watch;
//! - *shutting down* (terminal): the agent's shutdown token fired. The stream ends with
//!   `UNAVAILABLE`, the code clients retry on, so that tonic's graceful drain finishes
//!   instead of waiting for streams that never end on their own.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use super::bus::{RecvError, Subscription};
use super::proto::node_events_server::{NodeEvents, NodeEventsServer};
use super::{Error, EventBus, Result, filter, proto};

/// Mode of the socket file: the agent's user and group may connect, nobody else. The
/// events name every pod on the node, so they are not for every local user.
pub const SOCKET_MODE: u32 = 0o660;

/// How long open connections get to drain after shutdown before they are cut. Streams
/// end by themselves on shutdown, so this only bites on a client that stopped reading.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The event API server, not yet listening.
#[derive(Debug)]
pub struct EventApiServer {
    socket: PathBuf,
    bus: EventBus,
    shutdown_grace: Duration,
}

impl EventApiServer {
    /// A server for `socket` (see [`default_socket`](super::default_socket)) that
    /// streams what is published on `bus`.
    #[must_use]
    pub fn new(socket: PathBuf, bus: EventBus) -> Self {
        Self { socket, bus, shutdown_grace: DEFAULT_SHUTDOWN_GRACE }
    }

    /// Overrides [`DEFAULT_SHUTDOWN_GRACE`].
    #[must_use]
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Binds the socket and serves until `shutdown` is cancelled; then ends every open
    /// stream, drains connections (at most the shutdown grace) and removes the socket.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        self.bind().await?.run(shutdown).await
    }

    /// Binds the socket without serving yet, so that the caller sees a bad socket path at
    /// startup, and clients may connect (their calls wait) as soon as this returns.
    ///
    /// Creates the parent directory; replaces a stale socket file, but refuses to touch a
    /// socket something still listens on, or a path that is not a socket.
    pub async fn bind(self) -> Result<BoundEventApiServer> {
        let path = self.socket;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| Error::CreateDir { path: parent.to_owned(), source })?;
        }
        remove_stale_socket(&path).await?;
        let listener = UnixListener::bind(&path).map_err(|source| Error::Bind { path: path.clone(), source })?;
        // Until this chmod the socket has the umask's mode; with the usual 022 that lacks
        // the write bit connect(2) needs, so the window grants nobody extra access.
        let socket_file = SocketFile::new(path)?;
        std::fs::set_permissions(&socket_file.path, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(|source| Error::Permissions { path: socket_file.path.clone(), source })?;
        Ok(BoundEventApiServer { listener, socket_file, bus: self.bus, shutdown_grace: self.shutdown_grace })
    }
}

/// The event API server, bound to its socket.
#[derive(Debug)]
pub struct BoundEventApiServer {
    listener: UnixListener,
    socket_file: SocketFile,
    bus: EventBus,
    shutdown_grace: Duration,
}

impl BoundEventApiServer {
    /// The socket path this server listens on.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket_file.path
    }

    /// Serves until `shutdown` is cancelled, as [`EventApiServer::run`].
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let Self { listener, socket_file, bus, shutdown_grace } = self;
        info!(socket = %socket_file.path.display(), "event API listening");
        let service = NodeEventsServer::new(WatchService { bus, shutdown: shutdown.clone() });
        let serve = Server::builder().serve_with_incoming_shutdown(
            service,
            UnixListenerStream::new(listener),
            shutdown.clone().cancelled_owned(),
        );
        let result = tokio::select! {
            result = serve => result.map_err(|source| Error::Serve { path: socket_file.path.clone(), source }),
            () = async { shutdown.cancelled().await; tokio::time::sleep(shutdown_grace).await } => {
                warn!(
                    socket = %socket_file.path.display(),
                    grace = ?shutdown_grace,
                    "event API connections did not drain in time; closing them",
                );
                Ok(())
            }
        };
        drop(socket_file);
        info!("event API stopped");
        result
    }
}

/// Makes room for a new socket at `path`: nothing there, or a socket nobody listens on
/// (left by a crashed agent), which is removed.
async fn remove_stale_socket(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(Error::Inspect { path: path.to_owned(), source }),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket { path: path.to_owned() });
    }
    match UnixStream::connect(path).await {
        // WouldBlock: a live listener whose backlog is full.
        Ok(_) => return Err(Error::InUse { path: path.to_owned() }),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(Error::InUse { path: path.to_owned() }),
        Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound) => {}
        Err(source) => return Err(Error::Inspect { path: path.to_owned(), source }),
    }
    info!(socket = %path.display(), "removing stale event API socket");
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::RemoveStale { path: path.to_owned(), source }),
    }
}

/// The socket file this server created; removed on drop, so every exit path (shutdown,
/// serve error, a panic unwinding) cleans up.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    /// (device, inode) at bind time: if another agent has since replaced the file with
    /// its own socket, dropping ours must not delete theirs.
    id: (u64, u64),
}

impl SocketFile {
    fn new(path: PathBuf) -> Result<Self> {
        let meta = std::fs::symlink_metadata(&path).map_err(|source| Error::Inspect { path: path.clone(), source })?;
        Ok(Self { path, id: (meta.dev(), meta.ino()) })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if !ours {
            return;
        }
        if let Err(error) = std::fs::remove_file(&self.path) {
            warn!(socket = %self.path.display(), %error, "removing the event API socket");
        }
    }
}

/// The `NodeEvents` service: one bus subscription per `Watch` call.
#[derive(Debug)]
struct WatchService {
    bus: EventBus,
    shutdown: CancellationToken,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::NodeEvent, Status>> + Send>>;

#[tonic::async_trait]
impl NodeEvents for WatchService {
    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<proto::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let req = request.into_inner();
        filter::validate(&req)?;
        debug!(?req, "event API watch started");
        // Subscribe before returning: once the client has the response headers, it has
        // every event published from then on.
        let watch = Watch { req, sub: self.bus.subscribe(), shutdown: self.shutdown.clone() };
        let stream = futures::stream::unfold(Some(watch), |watch| async move {
            let mut watch = watch?;
            let item = watch.next().await;
            // A status ends the stream: no state is carried past it.
            let next = if item.is_ok() { Some(watch) } else { None };
            Some((item, next))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One open `Watch` stream.
struct Watch {
    req: proto::WatchRequest,
    sub: Subscription,
    shutdown: CancellationToken,
}

impl Watch {
    /// The next matching event, or the status that ends the stream.
    async fn next(&mut self) -> Result<proto::NodeEvent, Status> {
        loop {
            let received = tokio::select! {
                // Shutdown first: events still buffered are not worth delaying it.
                biased;
                () = self.shutdown.cancelled() => return Err(Status::unavailable("swiftlet is shutting down")),
                received = self.sub.recv() => received,
            };
            match received {
                Ok(ev) if filter::matches(&self.req, &ev) => return Ok(proto::NodeEvent::from(&*ev)),
                Ok(_) => {}
                Err(RecvError::Lagged { dropped }) => {
                    warn!(dropped, "event API client too slow; ending its stream");
                    return Err(Status::resource_exhausted(format!("client too slow, {dropped} events dropped")));
                }
                Err(RecvError::Closed) => return Err(Status::unavailable("swiftlet event bus closed")),
            }
        }
    }
}
