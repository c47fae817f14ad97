//! The manager against fake plugins served by tonic on unix sockets in a temporary
//! directory, and a fake handler that reports every call on a channel.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::{Request, Response, Status};

use super::proto::registration_server::{Registration, RegistrationServer};
use super::proto::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use super::*;

/// The bound on every "eventually"; generous, as the machine may be busy.
const WAIT: Duration = Duration::from_secs(30);

async fn next<T>(rx: &mut UnboundedReceiver<T>) -> T {
    tokio::time::timeout(WAIT, rx.recv()).await.expect("nothing arrived in time").expect("channel closed")
}

/// How a fake plugin answers `GetInfo`.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Info,
    /// Never answers.
    Hang,
    /// Fails the first call, then answers.
    FailFirst,
}

struct FakePlugin {
    info: PluginInfo,
    answer: Answer,
    failed_once: AtomicBool,
    get_info_calls: UnboundedSender<()>,
    statuses: UnboundedSender<RegistrationStatus>,
}

#[tonic::async_trait]
impl Registration for FakePlugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        let _ = self.get_info_calls.send(());
        match self.answer {
            Answer::Hang => std::future::pending().await,
            Answer::FailFirst if !self.failed_once.swap(true, Ordering::SeqCst) => {
                Err(Status::unavailable("not ready yet"))
            }
            Answer::Info | Answer::FailFirst => Ok(Response::new(self.info.clone())),
        }
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let _ = self.statuses.send(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A fake plugin being served, and what it saw.
struct Served {
    get_info_calls: UnboundedReceiver<()>,
    statuses: UnboundedReceiver<RegistrationStatus>,
    _stop: DropGuard,
}

fn serve(socket: &Path, info: PluginInfo, answer: Answer) -> Served {
    serve_on(UnixListener::bind(socket).unwrap(), info, answer)
}

fn serve_on(listener: UnixListener, info: PluginInfo, answer: Answer) -> Served {
    let (get_info_tx, get_info_calls) = mpsc::unbounded_channel();
    let (status_tx, statuses) = mpsc::unbounded_channel();
    let plugin = FakePlugin {
        info,
        answer,
        failed_once: AtomicBool::new(false),
        get_info_calls: get_info_tx,
        statuses: status_tx,
    };
    let stop = CancellationToken::new();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(plugin))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.clone().cancelled_owned()),
    );
    Served { get_info_calls, statuses, _stop: stop.drop_guard() }
}

/// A unix socket bound at `path` that does not listen yet: connecting to it is refused.
fn bind_without_listening(path: &Path) -> OwnedFd {
    // SAFETY: socket(2) takes no pointers; the descriptor it returns is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero is a valid `sockaddr_un` (an empty path).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is an initialized `sockaddr_un` of `len` bytes, alive for the call.
    let rc = unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) };
    assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
    fd
}

/// Starts listening on a socket from [`bind_without_listening`].
fn listen(fd: OwnedFd) -> UnixListener {
    // SAFETY: listen(2) on a descriptor we own; no pointers.
    let rc = unsafe { libc::listen(fd.as_raw_fd(), 16) };
    assert_eq!(rc, 0, "listen: {}", std::io::Error::last_os_error());
    let listener = std::os::unix::net::UnixListener::from(fd);
    listener.set_nonblocking(true).unwrap();
    UnixListener::from_std(listener).unwrap()
}

fn info(plugin_type: &str, name: &str, endpoint: &str) -> PluginInfo {
    PluginInfo {
        r#type: plugin_type.to_owned(),
        name: name.to_owned(),
        endpoint: endpoint.to_owned(),
        supported_versions: vec!["1.0.0".to_owned()],
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Register { name: String, endpoint: PathBuf, versions: Vec<String> },
    Deregister { name: String },
}

#[derive(Debug)]
struct FakeHandler {
    calls: UnboundedSender<Call>,
    refusal: Option<String>,
}

#[async_trait::async_trait]
impl PluginHandler for FakeHandler {
    async fn register(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        let _ = self.calls.send(Call::Register {
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            versions: versions.to_vec(),
        });
        self.refusal.clone().map_or(Ok(()), Err)
    }

    async fn deregister(&self, name: &str) {
        let _ = self.calls.send(Call::Deregister { name: name.to_owned() });
    }
}

fn handler(refusal: Option<&str>) -> (Arc<FakeHandler>, UnboundedReceiver<Call>) {
    let (calls, rx) = mpsc::unbounded_channel();
    (Arc::new(FakeHandler { calls, refusal: refusal.map(str::to_owned) }), rx)
}

/// A running manager, stopped when dropped.
struct Running {
    _stop: DropGuard,
    _task: JoinHandle<()>,
}

fn start(manager: PluginManager) -> Running {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.run(cancel.clone()));
    Running { _stop: cancel.drop_guard(), _task: task }
}

/// A manager of `dir` with a CSI handler (refusing with `refusal`, if any), started.
fn start_csi(dir: &Path, refusal: Option<&str>) -> (Running, UnboundedReceiver<Call>) {
    let (h, calls) = handler(refusal);
    let mut manager = PluginManager::new(dir.to_owned());
    manager.add_handler(CSI_PLUGIN, h);
    (start(manager), calls)
}

fn register_call(name: &str, endpoint: &Path) -> Call {
    Call::Register { name: name.to_owned(), endpoint: endpoint.to_owned(), versions: vec!["1.0.0".to_owned()] }
}

async fn expect_registered(plugin: &mut Served) {
    let status = next(&mut plugin.statuses).await;
    assert!(status.plugin_registered, "{status:?}");
    assert_eq!(status.error, "");
}

#[tokio::test]
async fn a_socket_that_appears_is_registered_with_its_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, mut calls) = start_csi(dir.path(), None);
    let mut plugin = serve(
        &dir.path().join("csi.example.com-reg.sock"),
        info(CSI_PLUGIN, "csi.example.com", "/var/lib/kubelet/plugins/csi.example.com/csi.sock"),
        Answer::Info,
    );
    assert_eq!(
        next(&mut calls).await,
        register_call("csi.example.com", Path::new("/var/lib/kubelet/plugins/csi.example.com/csi.sock"))
    );
    expect_registered(&mut plugin).await;
}

#[tokio::test]
async fn an_empty_endpoint_hands_over_the_socket_itself() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, mut calls) = start_csi(dir.path(), None);
    let socket = dir.path().join("csi.sock");
    let mut plugin = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut plugin).await;
}

#[tokio::test]
async fn a_socket_present_at_start_is_registered() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dra.sock");
    let mut plugin = serve(&socket, info(DRA_PLUGIN, "gpu.example.com", ""), Answer::Info);
    let (h, mut calls) = handler(None);
    let mut manager = PluginManager::new(dir.path().to_owned());
    manager.add_handler(DRA_PLUGIN, h);
    let _manager = start(manager);
    assert_eq!(next(&mut calls).await, register_call("gpu.example.com", &socket));
    expect_registered(&mut plugin).await;
}

#[tokio::test]
async fn a_socket_in_a_new_subdirectory_is_registered() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, mut calls) = start_csi(dir.path(), None);
    std::fs::create_dir(dir.path().join("driver")).unwrap();
    let socket = dir.path().join("driver/reg.sock");
    let mut plugin = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut plugin).await;
}

#[tokio::test]
async fn a_refusal_by_the_handler_is_reported_to_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, mut calls) = start_csi(dir.path(), Some("version 1.0.0 is not supported"));
    let socket = dir.path().join("csi.sock");
    let mut plugin = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    let status = next(&mut plugin.statuses).await;
    assert!(!status.plugin_registered);
    assert!(status.error.contains("version 1.0.0 is not supported"), "{status:?}");
}

#[tokio::test]
async fn a_plugin_of_an_unknown_type_is_told_so() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, _calls) = start_csi(dir.path(), None);
    let mut plugin = serve(&dir.path().join("odd.sock"), info("OddPlugin", "odd", ""), Answer::Info);
    let status = next(&mut plugin.statuses).await;
    assert!(!status.plugin_registered);
    assert!(status.error.contains("no handler registered for plugin type: OddPlugin"), "{status:?}");
}

#[tokio::test]
async fn a_removed_socket_deregisters_its_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, mut calls) = start_csi(dir.path(), None);
    let socket = dir.path().join("csi.sock");
    let mut plugin = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut plugin).await;

    std::fs::remove_file(&socket).unwrap();
    assert_eq!(next(&mut calls).await, Call::Deregister { name: "csi.example.com".to_owned() });
}

#[tokio::test]
async fn inotify_alone_delivers_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (h, mut calls) = handler(None);
    let mut manager = PluginManager::new(dir.path().to_owned());
    manager.add_handler(CSI_PLUGIN, h);
    // No periodic walk within the test's bounds: only inotify can tell.
    manager.reconcile_period = Duration::from_hours(1);
    let _manager = start(manager);
    let socket = dir.path().join("csi.sock");
    let mut plugin = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut plugin).await;
    std::fs::remove_file(&socket).unwrap();
    assert_eq!(next(&mut calls).await, Call::Deregister { name: "csi.example.com".to_owned() });
}

#[tokio::test]
async fn a_recreated_socket_deregisters_then_registers_again() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, mut calls) = start_csi(dir.path(), None);
    let socket = dir.path().join("csi.sock");
    let mut first = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut first).await;

    // The plugin restarts: a new process unlinks the old socket and binds its own.
    std::fs::remove_file(&socket).unwrap();
    let mut second = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, Call::Deregister { name: "csi.example.com".to_owned() });
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut second).await;
}

#[tokio::test]
async fn a_socket_is_dialed_until_its_plugin_listens() {
    let dir = tempfile::tempdir().unwrap();
    let (h, mut calls) = handler(None);
    let mut manager = PluginManager::new(dir.path().to_owned());
    manager.add_handler(CSI_PLUGIN, h);
    // No periodic pass to try again after a failed attempt: the one attempt must wait.
    manager.reconcile_period = Duration::from_hours(1);
    let _manager = start(manager);
    let socket = dir.path().join("csi.sock");
    let bound = bind_without_listening(&socket);
    // Not an assertion: leaves the manager time to find the socket refusing (a slower
    // manager finds it listening, and the test proves less but still passes).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut plugin = serve_on(listen(bound), info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut plugin).await;
}

#[tokio::test]
async fn a_hung_plugin_does_not_hold_back_another() {
    let dir = tempfile::tempdir().unwrap();
    let (h, mut calls) = handler(None);
    let mut manager = PluginManager::new(dir.path().to_owned());
    manager.add_handler(CSI_PLUGIN, h);
    // Long enough that the hung call is still under way when the other plugin registers.
    manager.timeouts.get_info = Duration::from_hours(1);
    let _manager = start(manager);

    let mut hung = serve(&dir.path().join("hung.sock"), info(CSI_PLUGIN, "hung.example.com", ""), Answer::Hang);
    next(&mut hung.get_info_calls).await;
    let socket = dir.path().join("ok.sock");
    let mut ok = serve(&socket, info(CSI_PLUGIN, "ok.example.com", ""), Answer::Info);
    assert_eq!(next(&mut calls).await, register_call("ok.example.com", &socket));
    expect_registered(&mut ok).await;
    assert!(hung.statuses.try_recv().is_err(), "the hung plugin cannot have been answered");
}

#[tokio::test]
async fn a_failed_get_info_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let (_manager, mut calls) = start_csi(dir.path(), None);
    let socket = dir.path().join("csi.sock");
    let mut plugin = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::FailFirst);
    next(&mut plugin.get_info_calls).await;
    next(&mut plugin.get_info_calls).await;
    assert_eq!(next(&mut calls).await, register_call("csi.example.com", &socket));
    expect_registered(&mut plugin).await;
}

#[tokio::test]
async fn the_directory_is_created_owner_and_group_only() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("plugins_registry");
    let cancel = CancellationToken::new();
    cancel.cancel();
    PluginManager::new(dir.clone()).run(cancel).await;
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o750);
}

#[tokio::test]
async fn total_plugins_shows_both_states() {
    let dir = tempfile::tempdir().unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = metrics::PluginManagerMetrics::new(&mut registry);
    let (h, mut calls) = handler(None);
    let mut manager = PluginManager::new(dir.path().to_owned()).with_metrics(metrics);
    manager.add_handler(CSI_PLUGIN, h);
    let _manager = start(manager);
    let socket = dir.path().join("csi.sock");
    let mut plugin = serve(&socket, info(CSI_PLUGIN, "csi.example.com", ""), Answer::Info);
    next(&mut calls).await;
    expect_registered(&mut plugin).await;

    // The manager records the registration once the operation has reported back, just
    // after the plugin heard of it.
    let line = |state: &str| {
        format!("plugin_manager_total_plugins{{socket_path=\"{}\",state=\"{state}\"}} 1", socket.display())
    };
    let encoded = || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &registry).unwrap();
        out
    };
    tokio::time::timeout(WAIT, async {
        while !encoded().contains(&line("actual_state_of_world")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no actual_state_of_world series:\n{}", encoded()));
    assert!(encoded().contains(&line("desired_state_of_world")), "{}", encoded());
}
