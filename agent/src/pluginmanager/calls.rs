//! What the handlers of registered plugins (CSI and DRA drivers) share to call them: a
//! lazily dialled channel to a plugin's unix socket, and a runtime of their own for the
//! calls, so that blocking code (volume tear-down on the blocking pool) can wait for a
//! call and calls keep real time whatever the caller's runtime does with its clock.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Dials the unix socket `socket` on first use, each call bounded by `timeout`.
#[must_use]
pub fn unix_channel(socket: &Path, timeout: Duration) -> Channel {
    lazy_unix(socket, Some(timeout))
}

/// Dials the unix socket `socket` on first use, without a time limit: for streams that
/// stay open as long as the plugin serves them.
#[must_use]
pub fn unix_stream_channel(socket: &Path) -> Channel {
    lazy_unix(socket, None)
}

fn lazy_unix(socket: &Path, timeout: Option<Duration>) -> Channel {
    // The connector ignores the URI; tonic needs a valid one.
    let mut endpoint = Endpoint::from_static("http://plugin.invalid");
    if let Some(timeout) = timeout {
        endpoint = endpoint.timeout(timeout);
    }
    let path = socket.to_owned();
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    }))
}

/// A current-thread runtime on a thread of its own (named `name`), stopped when dropped.
#[derive(Debug)]
pub struct CallRuntime {
    handle: tokio::runtime::Handle,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl CallRuntime {
    /// Starts the runtime and its thread.
    ///
    /// # Panics
    /// The runtime or the thread cannot be created (out of resources at start).
    #[must_use]
    pub fn start(name: &str) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a plugin call runtime");
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // Ends when the owner is dropped (the sender with it).
                let _ = rt.block_on(stopped);
            })
            .expect("a plugin call thread");
        Self { handle, _stop: stop }
    }

    /// The runtime's handle.
    #[must_use]
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}
