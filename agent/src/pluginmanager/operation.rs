//! The two operations on one plugin socket (upstream `operationexecutor`): registering
//! the plugin behind it, and deregistering it. Each runs as its own task so that a slow or
//! hung plugin or handler holds back nothing but its own socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::proto::registration_client::RegistrationClient;
use super::proto::{InfoRequest, PluginInfo, RegistrationStatus};
use super::{Handlers, PluginHandler};

/// The pause between attempts to connect to a socket that refuses.
const DIAL_RETRY: Duration = Duration::from_millis(100);

/// How long each step of a registration may take.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timeouts {
    /// Connecting to the socket (upstream: 10 s).
    pub dial: Duration,
    /// `GetInfo` (upstream: 1 s).
    pub get_info: Duration,
    /// `NotifyRegistrationStatus` (upstream: 5 s).
    pub notify: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { dial: Duration::from_secs(10), get_info: Duration::from_secs(1), notify: Duration::from_secs(5) }
    }
}

/// Why a plugin is not registered. A missing handler and a refusal are also reported to
/// the plugin; the other failures happen before there is anything to tell it, or while
/// telling it.
#[derive(Debug, thiserror::Error)]
pub(super) enum RegisterError {
    #[error("cannot connect to the plugin socket")]
    Dial(#[source] tonic::transport::Error),
    #[error("GetInfo failed")]
    GetInfo(#[source] tonic::Status),
    #[error("{call} took longer than {timeout:?}")]
    Timeout { call: &'static str, timeout: Duration },
    #[error("no handler registered for plugin type: {plugin_type}")]
    NoHandler { plugin_type: String },
    #[error("the {plugin_type} handler refused plugin {name:?}: {message}")]
    Refused { plugin_type: String, name: String, message: String },
    #[error("cannot tell plugin {name:?} it is registered (the handler was told to forget it)")]
    NotifySuccess {
        name: String,
        #[source]
        source: tonic::Status,
    },
}

/// A plugin the handler of its type accepted.
#[derive(Clone, Debug)]
pub(super) struct Registered {
    pub plugin_type: String,
    pub name: String,
    pub endpoint: PathBuf,
    pub handler: Arc<dyn PluginHandler>,
}

/// Dials `socket`, asks for the plugin's info, hands the plugin to the handler of its type
/// and tells the plugin the outcome.
pub(super) async fn register(
    socket: &Path,
    handlers: &Handlers,
    timeouts: Timeouts,
) -> Result<Registered, RegisterError> {
    let channel = dial(socket, timeouts.dial).await?;
    let mut client = RegistrationClient::new(channel);
    let info: PluginInfo = within(timeouts.get_info, "GetInfo", client.get_info(InfoRequest {}))
        .await?
        .map_err(RegisterError::GetInfo)?
        .into_inner();
    tracing::debug!(plugin_type = %info.r#type, name = %info.name, endpoint = %info.endpoint, versions = ?info.supported_versions, "plugin info");

    let Some((&plugin_type, handler)) = handlers.get_key_value(info.r#type.as_str()) else {
        let e = RegisterError::NoHandler { plugin_type: info.r#type };
        notify_failure(&mut client, e.to_string(), timeouts).await;
        return Err(e);
    };
    // A plugin that serves its own API on the registration socket leaves the endpoint out.
    let endpoint = if info.endpoint.is_empty() { socket.to_owned() } else { PathBuf::from(&info.endpoint) };
    if let Err(message) = handler.register(&info.name, &endpoint, &info.supported_versions).await {
        notify_failure(&mut client, format!("registration of plugin {:?} failed: {message}", info.name), timeouts)
            .await;
        return Err(RegisterError::Refused { plugin_type: plugin_type.to_owned(), name: info.name, message });
    }
    if let Err(source) = notify(&mut client, true, String::new(), timeouts).await {
        // The plugin does not know it is registered, and will go on waiting or exit: as
        // upstream, the handler forgets it and the next reconcile tries again.
        handler.deregister(&info.name).await;
        return Err(RegisterError::NotifySuccess { name: info.name, source });
    }
    Ok(Registered { plugin_type: plugin_type.to_owned(), name: info.name, endpoint, handler: Arc::clone(handler) })
}

/// Tells the handler that the plugin is gone.
pub(super) async fn deregister(plugin: &Registered) {
    plugin.handler.deregister(&plugin.name).await;
}

/// Connects to the plugin's unix socket, trying again while it refuses: the socket file
/// appears at `bind`, a moment before the plugin listens on it (upstream's dial blocks
/// until connected, too).
async fn dial(socket: &Path, timeout: Duration) -> Result<Channel, RegisterError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, connect(socket)).await {
            Ok(Ok(channel)) => return Ok(channel),
            Ok(Err(e)) if tokio::time::Instant::now() + DIAL_RETRY >= deadline => return Err(RegisterError::Dial(e)),
            Ok(Err(e)) => {
                tracing::trace!(error = %e, "plugin socket refuses connections yet");
                tokio::time::sleep(DIAL_RETRY).await;
            }
            Err(_) => return Err(RegisterError::Timeout { call: "connecting", timeout }),
        }
    }
}

/// One connection attempt (the URI is a placeholder tonic needs; the connector ignores it).
async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_owned();
    Endpoint::from_static("http://plugin-registration.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
}

/// Reports a refusal; the plugin not hearing it changes nothing for the manager.
async fn notify_failure(client: &mut RegistrationClient<Channel>, error: String, timeouts: Timeouts) {
    if let Err(e) = notify(client, false, error, timeouts).await {
        tracing::debug!(error = %e, "cannot tell the plugin its registration failed");
    }
}

async fn notify(
    client: &mut RegistrationClient<Channel>,
    plugin_registered: bool,
    error: String,
    timeouts: Timeouts,
) -> Result<(), tonic::Status> {
    let status = RegistrationStatus { plugin_registered, error };
    match tokio::time::timeout(timeouts.notify, client.notify_registration_status(status)).await {
        Ok(r) => r.map(drop),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "NotifyRegistrationStatus took longer than {:?}",
            timeouts.notify
        ))),
    }
}

async fn within<F: Future>(timeout: Duration, call: &'static str, f: F) -> Result<F::Output, RegisterError> {
    tokio::time::timeout(timeout, f).await.map_err(|_| RegisterError::Timeout { call, timeout })
}
